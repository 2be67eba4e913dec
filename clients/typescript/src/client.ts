// The client: sessions, submissions, streams, turns, approvals and usage,
// over one `Transport`.

import { SubmissionRejectedError } from "./errors.js";
import { EventStream, type StreamOptions } from "./stream.js";
import { type KeelOptions, Transport, segment } from "./transport.js";
import {
  type Accepted,
  type ApprovalDecision,
  type BusyPolicy,
  type CreateSessionRequest,
  type EventPage,
  type ForkRequest,
  type Op,
  type RecordedEvent,
  type Session,
  type SessionPage,
  type SubmitRequest,
  type UpdateSessionRequest,
  type Usage,
  turnOf,
} from "./types.js";

/** How a submission is sent. */
export interface SubmitOptions {
  /** What a `user_input` does while the session is busy (the session's default otherwise). */
  onBusy?: BusyPolicy | undefined;
  /** The key that makes retries safe; a fresh UUID by default. Pass your own to retry across processes. */
  idempotencyKey?: string | undefined;
  signal?: AbortSignal | undefined;
}

/** How `waitForTurn` waits. */
export interface WaitOptions {
  /** Called with every event seen while waiting, in order (awaited before the next). */
  onEvent?: ((event: RecordedEvent) => void | Promise<void>) | undefined;
  /** Gives up after this many milliseconds (throws a `TimeoutError` `DOMException`). */
  timeoutMs?: number | undefined;
  signal?: AbortSignal | undefined;
}

/** A turn that ended. */
export interface TurnResult {
  /** The turn's id. */
  turnId: string;
  /** Whether it ended with `turn_complete` (else `turn_aborted`). */
  completed: boolean;
  /** The event that ended it. */
  end: RecordedEvent;
  /** The turn's events, in order, the ending one included. */
  events: RecordedEvent[];
  /** The text of its last `assistant_message` (the answer), or `""`. */
  text: string;
}

/** The sessions of a server. */
export class Sessions {
  constructor(private readonly transport: Transport) {}

  /** Creates a session (`201`); every field of `request` is optional. */
  create(request: CreateSessionRequest = {}, options: { signal?: AbortSignal } = {}): Promise<Session> {
    return this.transport.json({ method: "POST", path: "/v1/sessions", body: request, signal: options.signal });
  }

  /** One session. */
  get(id: string, options: { signal?: AbortSignal } = {}): Promise<Session> {
    return this.transport.json({ method: "GET", path: path(id), signal: options.signal, resend: true });
  }

  /** A page of sessions, newest created first; pass `next_cursor` back as `cursor` for the next. */
  list(
    options: { limit?: number; cursor?: string; botId?: string; signal?: AbortSignal } = {},
  ): Promise<SessionPage> {
    return this.transport.json({
      method: "GET",
      path: "/v1/sessions",
      query: { limit: options.limit, cursor: options.cursor, bot_id: options.botId },
      signal: options.signal,
      resend: true,
    });
  }

  /** Every session, page by page, newest created first. */
  async *all(options: { limit?: number; botId?: string; signal?: AbortSignal } = {}): AsyncGenerator<Session> {
    let cursor: string | undefined;
    do {
      const page = await this.list({ ...options, ...(cursor === undefined ? {} : { cursor }) });
      yield* page.sessions;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  /** A new session whose history is `id`'s as it was at `request.at_sequence` (or before `request.before_turn`). */
  fork(id: string, request: ForkRequest, options: { signal?: AbortSignal } = {}): Promise<Session> {
    return this.transport.json({ method: "POST", path: `${path(id)}/fork`, body: request, signal: options.signal });
  }

  /** Renames a session. */
  rename(id: string, title: string, options: { signal?: AbortSignal } = {}): Promise<Session> {
    return this.transport.json({ method: "PATCH", path: path(id), body: { title } satisfies UpdateSessionRequest, signal: options.signal });
  }

  /**
   * Switches a session's model (a spec as at creation; see `GET /v1/models`), used from its next turn; refused
   * (`session_busy`) while a turn is in flight.
   */
  setModel(id: string, model: string, options: { signal?: AbortSignal } = {}): Promise<Session> {
    return this.transport.json({ method: "PATCH", path: path(id), body: { model } satisfies UpdateSessionRequest, signal: options.signal });
  }

  /** Deletes a session for good; with `workspace: true` its workspace directory too. */
  async delete(id: string, options: { workspace?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    await this.transport.json({
      method: "DELETE",
      path: path(id),
      query: { workspace: options.workspace === true ? true : undefined },
      signal: options.signal,
    });
  }
}

/** A client of one Keel server. */
export class Keel {
  /** Create, read, list, fork, rename and delete sessions. */
  readonly sessions: Sessions;
  private readonly transport: Transport;

  constructor(options: KeelOptions) {
    this.transport = new Transport(options);
    this.sessions = new Sessions(this.transport);
  }

  /**
   * Submits `op` (`202` once it is stored). The request carries an
   * `Idempotency-Key` (a fresh UUID unless given) and is retried with the
   * same key on a network error or a `503`, so it is queued once however
   * often it is sent; a retry that the server had already stored answers
   * `duplicate: true` with the first answer's id and sequence. The one
   * exception: an `interrupt` without a `turn_id`, or a `shutdown`, whose
   * answer was lost is not sent again (keys do not cover control ops, and a
   * second copy could stop the work that came after the first); it throws
   * `KeelConnectionError`, and the caller, who knows what runs, decides.
   */
  submit(sessionId: string, op: Op, options: SubmitOptions = {}): Promise<Accepted> {
    const key = options.idempotencyKey ?? newKey();
    return this.transport.json({
      method: "POST",
      path: `${path(sessionId)}/submissions`,
      body: (options.onBusy === undefined ? { op } : { op, on_busy: options.onBusy }) satisfies SubmitRequest,
      headers: { "Idempotency-Key": key },
      signal: options.signal,
      resend: safeToResend(op),
    });
  }

  /** Submits a user message (`user_input`); see `submit`. */
  say(sessionId: string, text: string, options: SubmitOptions = {}): Promise<Accepted> {
    return this.submit(sessionId, { type: "user_input", text }, options);
  }

  /** Answers a tool call waiting for approval (its `approval_requested` event's `call_id`). */
  approve(
    sessionId: string,
    callId: string,
    decision: ApprovalDecision = "approve",
    options: { signal?: AbortSignal } = {},
  ): Promise<Accepted> {
    return this.submit(sessionId, { type: "approval", call_id: callId, decision }, options);
  }

  /** Interrupts the running turn (only `turnId`, when given). */
  interrupt(sessionId: string, turnId?: string, options: { signal?: AbortSignal } = {}): Promise<Accepted> {
    return this.submit(sessionId, turnId === undefined ? { type: "interrupt" } : { type: "interrupt", turn_id: turnId }, options);
  }

  /** The call ids of the session's tool calls waiting for a decision. */
  async pendingApprovals(sessionId: string, options: { signal?: AbortSignal } = {}): Promise<string[]> {
    return (await this.sessions.get(sessionId, options)).pending_approvals;
  }

  /** The session's events after `after` as a resuming stream; see `EventStream`. */
  stream(sessionId: string, options: StreamOptions = {}): EventStream {
    return new EventStream(this.transport, sessionId, options);
  }

  /** A page of the session's log: after `after` (forwards) or before `before` (backwards, the newest by default), oldest first. */
  events(
    sessionId: string,
    options: { after?: number; before?: number; limit?: number; signal?: AbortSignal } = {},
  ): Promise<EventPage> {
    return this.transport.json({
      method: "GET",
      path: `${path(sessionId)}/events`,
      query: { after: options.after, before: options.before, limit: options.limit },
      signal: options.signal,
      resend: true,
    });
  }

  /** Tokens used, per session, per bot and in all (only bot `botId`'s, only since `since` ms when given). */
  usage(options: { botId?: string; since?: number; signal?: AbortSignal } = {}): Promise<Usage> {
    return this.transport.json({
      method: "GET",
      path: "/v1/usage",
      query: { bot_id: options.botId, since: options.since },
      signal: options.signal,
      resend: true,
    });
  }

  /**
   * Waits until the turn that `accepted` (a submission's answer) started or
   * joined has ended (`turn_complete` or `turn_aborted`), following the
   * stream from the submission on; it resumes across disconnects like
   * `stream`. Throws `SubmissionRejectedError` when the session refused
   * the submission. A turn waiting for approval waits: answer it from
   * `onEvent` (or elsewhere) with `approve`.
   */
  async waitForTurn(sessionId: string, accepted: Accepted, options: WaitOptions = {}): Promise<TurnResult> {
    const signals = [options.signal, options.timeoutMs === undefined ? undefined : AbortSignal.timeout(options.timeoutMs)];
    const signal = anySignal(signals.filter((each): each is AbortSignal => each !== undefined));
    const byTurn = new Map<string, RecordedEvent[]>();
    let turnId: string | undefined;
    const stream = this.stream(sessionId, { after: Math.max(0, accepted.sequence - 1), signal });
    for await (const event of stream) {
      await options.onEvent?.(event);
      const turn = turnOf(event.msg);
      if (turn !== undefined) {
        const events = byTurn.get(turn) ?? [];
        events.push(event);
        byTurn.set(turn, events);
      }
      if (turnId === undefined && event.submission_id === accepted.submission_id) {
        if (event.msg.type === "submission_rejected") {
          throw new SubmissionRejectedError(accepted.submission_id, event.msg.reason);
        }
        turnId = turn;
      }
      if (turnId !== undefined && turn === turnId && (event.msg.type === "turn_complete" || event.msg.type === "turn_aborted")) {
        const events = byTurn.get(turnId) ?? [event];
        return { turnId, completed: event.msg.type === "turn_complete", end: event, events, text: answer(events) };
      }
    }
    throw signal?.reason ?? new Error("the event stream ended");
  }
}

/**
 * A fresh idempotency key: a random UUID. Browsers offer `randomUUID` only
 * to secure contexts (https, localhost); elsewhere it is made from
 * `getRandomValues`, which they all offer.
 */
function newKey(): string {
  const crypto = globalThis.crypto;
  if (typeof crypto.randomUUID === "function") {
    return crypto.randomUUID();
  }
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = ((bytes[6] ?? 0) & 0x0f) | 0x40;
  bytes[8] = ((bytes[8] ?? 0) & 0x3f) | 0x80;
  const hex = [...bytes].map((byte) => byte.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * Whether `op` may be sent again when its answer was lost. Work stored
 * ahead is deduplicated by its key; a decision sent twice finds no call
 * waiting, and an interrupt of a named turn that ended finds nothing to
 * stop. An interrupt of whatever runs, or a shutdown, could stop later work.
 */
function safeToResend(op: Op): boolean {
  if (op.type === "interrupt") {
    return typeof op.turn_id === "string";
  }
  return op.type !== "shutdown";
}

/** The path of session `id`. */
function path(id: string): string {
  return `/v1/sessions/${segment(id)}`;
}

/** The text of the last `assistant_message` among `events`. */
function answer(events: RecordedEvent[]): string {
  let text = "";
  for (const event of events) {
    if (event.msg.type === "assistant_message") {
      text = event.msg.text;
    }
  }
  return text;
}

/** A signal that aborts when any of `signals` does (`AbortSignal.any` is newer than some supported platforms). */
function anySignal(signals: AbortSignal[]): AbortSignal | undefined {
  if (signals.length <= 1) {
    return signals[0];
  }
  const controller = new AbortController();
  for (const signal of signals) {
    if (signal.aborted) {
      controller.abort(signal.reason);
      break;
    }
    signal.addEventListener("abort", () => controller.abort(signal.reason), { once: true });
  }
  return controller.signal;
}
