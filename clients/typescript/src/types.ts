// The API's types by name, taken from the types generated from the OpenAPI
// document (src/generated/openapi.ts, `npm run generate`), so they cannot
// drift from the server's contract.

import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** A recorded event of a session's log: `sequence`, `recorded_at_ms`, `submission_id`, `msg`. */
export type RecordedEvent = Schemas["RecordedEvent"];
/** What happened: one of the protocol's event messages, tagged by `type`. */
export type EventMsg = Schemas["EventMsg"];
/** The `type` tag of an event message. */
export type EventType = EventMsg["type"];
/** The event message of type `T`. */
export type EventMsgOf<T extends EventType> = Extract<EventMsg, { type: T }>;
/** A request to a session: one of the protocol's ops, tagged by `type`. */
export type Op = Schemas["Op"];
/** What a user message does while the session is busy. */
export type BusyPolicy = Schemas["BusyPolicy"];
/** An answer to a tool call that waits for approval. */
export type ApprovalDecision = Schemas["ApprovalDecision"];
/** Tokens the providers reported. */
export type TokenUsage = Schemas["TokenUsage"];
/** A session as the server shows it. */
export type Session = Schemas["SessionView"];
/** What a session is doing: `idle`, `running` or `awaiting_approval`. */
export type SessionState = Schemas["ViewState"];
/** A page of sessions, newest created first. */
export type SessionPage = Schemas["SessionList"];
/** The body of `POST /v1/sessions`; every field is optional. */
export type CreateSessionRequest = Schemas["CreateSession"];
/** The body of `PATCH /v1/sessions/{id}`. */
export type UpdateSessionRequest = Schemas["UpdateSession"];
/** The body of `POST /v1/sessions/{id}/submissions`. */
export type SubmitRequest = Schemas["SubmitRequest"];
/** The body of `POST /v1/sessions/{id}/fork`. */
export type ForkRequest = Schemas["ForkSession"];
/** The answer to a submission: its id, the sequence of its `submission_queued`, and whether it repeats an earlier one. */
export type Accepted = Schemas["AcceptedView"];
/** A page of a session's log. */
export type EventPage = Schemas["EventsView"];
/** The answer of `GET /v1/usage`. */
export type Usage = Schemas["UsageReport"];
/**
 * An error body's `error`: its machine code and message (each route's
 * answers narrow `code` to the route's codes).
 */
export type ErrorBody = Schemas["ErrorBody"];

/** Whether `event`'s message is of type `type` (narrows it). */
export function isEvent<T extends EventType>(
  event: RecordedEvent,
  type: T,
): event is RecordedEvent & { msg: EventMsgOf<T> } {
  return event.msg.type === type;
}

/** The turn an event message belongs to, when it belongs to one. */
export function turnOf(msg: EventMsg): string | undefined {
  const turn = (msg as { turn_id?: unknown }).turn_id;
  return typeof turn === "string" ? turn : undefined;
}
