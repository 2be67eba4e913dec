// Provisional until docs/openapi.json exists.
type Turn = { turn_id: string };
export interface components {
  schemas: {
    Event: { sequence: number; recorded_at_ms: number; submission_id: string | null; msg: components["schemas"]["EventMsg"] };
    EventMsg:
      | ({ type: "turn_started" } & Turn)
      | ({ type: "user_message"; text: string } & Turn)
      | ({ type: "assistant_message"; text: string } & Turn)
      | ({ type: "assistant_content_delta"; delta: string } & Turn)
      | ({ type: "approval_requested"; call_id: string; name: string; arguments: string } & Turn)
      | ({ type: "turn_complete"; length_limited?: boolean } & Turn)
      | ({ type: "turn_aborted"; reason: string; message: string } & Turn)
      | { type: "submission_rejected"; reason: string }
      | { type: "submission_queued"; op: components["schemas"]["Op"]; on_busy: components["schemas"]["BusyPolicy"]; idempotency_key?: string }
      | ({ type: "approval_decided"; call_id: string; decision: components["schemas"]["ApprovalDecision"] } & Turn)
      | ({ type: "tool_call_completed"; call_id: string; output: string; is_error: boolean } & Turn)
      | { type: "shutdown_complete" }
      | { type: "session_forked"; parent_session_id: string }
      | { type: "session_started"; session_id: string; resumed: boolean };
    Op:
      | { type: "user_input"; text: string }
      | { type: "steer"; text: string }
      | { type: "interrupt"; turn_id?: string }
      | { type: "approval"; call_id: string; decision: components["schemas"]["ApprovalDecision"] }
      | { type: "shutdown" }
      | { type: "compact" }
      | { type: "regenerate" };
    BusyPolicy: "queue" | "interrupt" | "reject" | "steer";
    ApprovalDecision: "approve" | "approve_for_session" | "deny";
    TokenUsage: { input_tokens: number; cached_input_tokens: number; output_tokens: number; reasoning_tokens: number };
    SessionView: {
      id: string; title: string | null; bot_id: string; context: Record<string, unknown>; model: string | null;
      on_busy: components["schemas"]["BusyPolicy"]; created_at_ms: number; updated_at_ms: number; last_sequence: number;
      state: "idle" | "running" | "awaiting_approval"; running_turn_id: string | null; queued: number;
      pending_approvals: string[]; usage: components["schemas"]["TokenUsage"]; turns_completed: number; live: boolean;
    };
    SessionList: { sessions: components["schemas"]["SessionView"][]; next_cursor: string | null };
    CreateSession: {
      id?: string; model?: string; bot_id?: string; context?: Record<string, unknown>; instructions?: string;
      tools?: { builtin?: boolean; write?: boolean; shell?: boolean; network?: boolean; sandbox?: "read-only" | "workspace-write" | "full-access" };
      approvals?: { default?: "ask" | "auto"; tools?: Record<string, "ask" | "auto"> };
      on_busy?: components["schemas"]["BusyPolicy"];
    };
    ForkRequest: { at_sequence?: number; before_turn?: string; id?: string; message?: string };
    AcceptedView: { submission_id: string; sequence: number; duplicate: boolean };
    EventPage: { events: components["schemas"]["Event"][]; has_more: boolean };
    UsageView: { bot_id: string | null; since: number | null; total: components["schemas"]["TokenUsage"]; bots: unknown[]; sessions: unknown[] };
    ErrorBody: { code: string; message: string };
  };
}
