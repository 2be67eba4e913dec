//! Events: the facts a session records, in order.

use std::ops::Deref;

use serde::{Deserialize, Serialize};

use super::instructions::ProjectInstructions;
use super::op::{BusyPolicy, Op};

/// An event before it is recorded: what happened and which submission caused it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    /// The submission this event answers, if any.
    pub submission_id: Option<String>,
    /// What happened.
    pub msg: EventMsg,
}

/// An event as stored in a session's log and delivered to clients.
///
/// JSON: `{"sequence": 7, "recorded_at_ms": 1764430000000,
/// "submission_id": "…" | null, "msg": {"type": "turn_started", …}}`.
/// `sequence` starts at 1 and has no gaps within a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RecordedEvent {
    /// Position in the session's log.
    pub sequence: u64,
    /// When the event was committed, in milliseconds since the Unix epoch.
    pub recorded_at_ms: u64,
    /// The event itself.
    #[serde(flatten)]
    pub event: Event,
}

/// A recorded event is an event with a position; reading through it is the
/// common case (`recorded.msg`).
impl Deref for RecordedEvent {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.event
    }
}

/// What happened. Serialized with a `type` tag in snake case, the payload's
/// fields beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventMsg {
    /// A runtime opened the session (new or resumed).
    SessionStarted(SessionStartedEvent),
    /// The session was forked from another: its history starts as the
    /// parent's was at `at_sequence`. The first event of a fork.
    SessionForked(SessionForkedEvent),
    /// A turn began.
    TurnStarted(TurnStartedEvent),
    /// A user message joined a turn.
    UserMessage(UserMessageEvent),
    /// The model was called for a step of the turn.
    ModelStepStarted(ModelStepStartedEvent),
    /// Streamed assistant text (coalesced from the model's deltas).
    AssistantContentDelta(AssistantContentDeltaEvent),
    /// Streamed reasoning text, for display (coalesced like content).
    ReasoningDelta(ReasoningDeltaEvent),
    /// The assistant's complete message for a step.
    AssistantMessage(AssistantMessageEvent),
    /// A tool call waits for the user's decision (an `approval` op).
    ApprovalRequested(ApprovalRequestedEvent),
    /// The user decided about a tool call.
    ApprovalDecided(ApprovalDecidedEvent),
    /// The model asked for a tool call, which is about to run.
    ToolCallStarted(ToolCallStartedEvent),
    /// A tool call finished (or failed); its result goes back to the model.
    ToolCallCompleted(ToolCallCompletedEvent),
    /// A running tool call reported how far it got (an MCP server's progress).
    ToolCallProgress(ToolCallProgressEvent),
    /// The model called a tool that the client executes: the turn waits,
    /// durably, for a `client_tool_result` op naming the call (or for the
    /// wait's deadline, which answers the call as an error).
    ClientToolRequested(crate::ClientToolRequestedEvent),
    /// The tools offered to the model changed (an MCP server's
    /// `tools/list_changed`); the next model step gets the new list.
    ToolsChanged(ToolsChangedEvent),
    /// Tokens a model step used, and the session's totals.
    TokenUsage(TokenUsageEvent),
    /// The turn ended normally.
    TurnComplete(TurnCompleteEvent),
    /// The turn ended early; `reason` says why.
    TurnAborted(TurnAbortedEvent),
    /// Something worth knowing that did not stop anything.
    Warning(WarningEvent),
    /// Something failed; if it ended a turn, a `turn_aborted` follows.
    Error(ErrorEvent),
    /// A submission was accepted into the queue but will not be acted on.
    SubmissionRejected(SubmissionRejectedEvent),
    /// A submission was stored durably before being queued; after a crash
    /// it is still queued. The envelope's `submission_id` is its id.
    SubmissionQueued(SubmissionQueuedEvent),
    /// The runtime stopped after a shutdown op; the last event of that runtime.
    ShutdownComplete(ShutdownCompleteEvent),
    /// The older part of the history was replaced, for the model, by a
    /// summary; the events it summarizes stay in the log.
    ContextCompacted(ContextCompactedEvent),
    /// The last turn was rolled back (a `regenerate` op): its history items
    /// left the history the model sees; its events stay in the log. The
    /// new turn that runs its user messages again follows in the same commit.
    TurnRolledBack(TurnRolledBackEvent),
    /// The session's model was changed (`PATCH /v1/sessions/{id}`) while
    /// no turn ran; the turns after it are answered by its `model`.
    ModelChanged(ModelChangedEvent),
    /// The project instructions (`AGENTS.md` files) the session read at
    /// its first turn, recorded once: the session keeps using this text.
    InstructionsLoaded(ProjectInstructions),
}

/// The event types a webhook endpoint can subscribe to: the moments a
/// session needs someone (an approval, a client's tool result), a turn
/// ended, the session went idle ([`SESSION_IDLE_WEBHOOK`]), or it failed.
/// The store writes a delivery for each endpoint that wants one in the
/// transaction of the event itself.
pub const WEBHOOK_EVENT_TYPES: &[&str] = &[
    "approval_requested",
    "client_tool_requested",
    "turn_complete",
    "turn_aborted",
    SESSION_IDLE_WEBHOOK,
    "error",
    "shutdown_complete",
];

/// The webhook type of a turn's end (`turn_complete` or `turn_aborted`)
/// after which the session has nothing queued: it waits for its next
/// input. Not an event of the log of its own: its delivery carries the
/// turn's end, and the store decides it in that event's transaction, from
/// the queue as the transaction leaves it.
pub const SESSION_IDLE_WEBHOOK: &str = "session_idle";

impl EventMsg {
    /// This event's type when webhooks can subscribe to it (one of
    /// [`WEBHOOK_EVENT_TYPES`]).
    pub fn webhook_type(&self) -> Option<&'static str> {
        let kind = self.kind();
        WEBHOOK_EVENT_TYPES.contains(&kind).then_some(kind)
    }

    /// The `type` tag of this event, as it appears on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            EventMsg::SessionStarted(_) => "session_started",
            EventMsg::SessionForked(_) => "session_forked",
            EventMsg::TurnStarted(_) => "turn_started",
            EventMsg::UserMessage(_) => "user_message",
            EventMsg::ModelStepStarted(_) => "model_step_started",
            EventMsg::AssistantContentDelta(_) => "assistant_content_delta",
            EventMsg::ReasoningDelta(_) => "reasoning_delta",
            EventMsg::AssistantMessage(_) => "assistant_message",
            EventMsg::ApprovalRequested(_) => "approval_requested",
            EventMsg::ApprovalDecided(_) => "approval_decided",
            EventMsg::ToolCallStarted(_) => "tool_call_started",
            EventMsg::ToolCallCompleted(_) => "tool_call_completed",
            EventMsg::ToolCallProgress(_) => "tool_call_progress",
            EventMsg::ClientToolRequested(_) => "client_tool_requested",
            EventMsg::ToolsChanged(_) => "tools_changed",
            EventMsg::TokenUsage(_) => "token_usage",
            EventMsg::TurnComplete(_) => "turn_complete",
            EventMsg::TurnAborted(_) => "turn_aborted",
            EventMsg::Warning(_) => "warning",
            EventMsg::Error(_) => "error",
            EventMsg::SubmissionRejected(_) => "submission_rejected",
            EventMsg::SubmissionQueued(_) => "submission_queued",
            EventMsg::ShutdownComplete(_) => "shutdown_complete",
            EventMsg::ContextCompacted(_) => "context_compacted",
            EventMsg::TurnRolledBack(_) => "turn_rolled_back",
            EventMsg::ModelChanged(_) => "model_changed",
            EventMsg::InstructionsLoaded(_) => "instructions_loaded",
        }
    }

    /// The turn this event belongs to, if it belongs to one.
    pub fn turn_id(&self) -> Option<&str> {
        match self {
            EventMsg::TurnStarted(e) => Some(&e.turn_id),
            EventMsg::UserMessage(e) => Some(&e.turn_id),
            EventMsg::ModelStepStarted(e) => Some(&e.turn_id),
            EventMsg::AssistantContentDelta(e) => Some(&e.turn_id),
            EventMsg::ReasoningDelta(e) => Some(&e.turn_id),
            EventMsg::AssistantMessage(e) => Some(&e.turn_id),
            EventMsg::ApprovalRequested(e) => Some(&e.turn_id),
            EventMsg::ApprovalDecided(e) => Some(&e.turn_id),
            EventMsg::ToolCallStarted(e) => Some(&e.turn_id),
            EventMsg::ToolCallCompleted(e) => Some(&e.turn_id),
            EventMsg::ToolCallProgress(e) => Some(&e.turn_id),
            EventMsg::ClientToolRequested(e) => Some(&e.turn_id),
            EventMsg::ToolsChanged(e) => Some(&e.turn_id),
            EventMsg::TokenUsage(e) => Some(&e.turn_id),
            EventMsg::TurnComplete(e) => Some(&e.turn_id),
            EventMsg::TurnAborted(e) => Some(&e.turn_id),
            EventMsg::Error(e) => e.turn_id.as_deref(),
            EventMsg::ContextCompacted(e) => e.turn_id.as_deref(),
            EventMsg::SessionStarted(_)
            | EventMsg::SessionForked(_)
            | EventMsg::Warning(_)
            | EventMsg::SubmissionRejected(_)
            | EventMsg::SubmissionQueued(_)
            | EventMsg::ShutdownComplete(_)
            | EventMsg::ModelChanged(_)
            | EventMsg::InstructionsLoaded(_)
            // Between turns: it names the turn it undid, which has ended.
            | EventMsg::TurnRolledBack(_) => None,
        }
    }

    /// Whether this event closes a turn.
    pub fn ends_turn(&self) -> bool {
        matches!(self, EventMsg::TurnComplete(_) | EventMsg::TurnAborted(_))
    }
}

/// Payload of [`EventMsg::SessionStarted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionStartedEvent {
    /// The session's id.
    pub session_id: String,
    /// The bot this session belongs to.
    pub bot_id: String,
    /// `true` when an existing session was reopened.
    pub resumed: bool,
    /// Number of history items restored from the checkpoint.
    pub history_items: u64,
    /// Tool calls of a turn that was waiting for approval when the session
    /// was last closed; the turn goes on once they are decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<String>,
    /// The sandbox the session's shell commands run under, when it has a
    /// shell tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxInfo>,
    /// The names of the tools offered to the model, sorted (absent when
    /// there are none, and in logs written before it was recorded); a
    /// `tools_changed` event says when they change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

/// Payload of [`EventMsg::SessionForked`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionForkedEvent {
    /// The session this one was forked from.
    pub parent_session_id: String,
    /// The parent's event the fork starts after.
    pub at_sequence: u64,
    /// History items taken from the parent.
    pub history_items: u64,
}

/// The sandbox a session's shell commands run under, as recorded in
/// [`SessionStartedEvent`]. Each shell result also starts with the status
/// that applied to that command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxInfo {
    /// The policy asked for: `read-only`, `workspace-write` or `full-access`.
    pub policy: String,
    /// Whether the operating system enforces it.
    pub enforced: bool,
    /// How, or why not: which kernel features applied.
    pub detail: String,
    /// Whether commands are kept off the network (absent in logs written
    /// before it was recorded).
    #[serde(default)]
    pub network_blocked: bool,
}

/// Payload of [`EventMsg::TurnStarted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnStartedEvent {
    /// The new turn's id.
    pub turn_id: String,
    /// The trace the turn's spans belong to (32 hex digits), for finding
    /// the turn in a trace back end and its log lines. Absent in logs of
    /// versions that kept none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// Payload of [`EventMsg::UserMessage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserMessageEvent {
    /// The turn the message joined.
    pub turn_id: String,
    /// The message text.
    pub text: String,
}

/// Payload of [`EventMsg::ModelStepStarted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelStepStartedEvent {
    /// The turn.
    pub turn_id: String,
    /// The step's number within the turn, from 1.
    pub step: u32,
    /// The id of the assistant message this step writes (its text and tool
    /// calls), stable for front ends that key messages by id. Absent in
    /// logs written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

/// Payload of [`EventMsg::AssistantContentDelta`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AssistantContentDeltaEvent {
    /// The turn.
    pub turn_id: String,
    /// Text to append to what was streamed so far.
    pub delta: String,
}

/// Payload of [`EventMsg::ReasoningDelta`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReasoningDeltaEvent {
    /// The turn.
    pub turn_id: String,
    /// Reasoning text to append.
    pub delta: String,
}

/// Payload of [`EventMsg::ApprovalRequested`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalRequestedEvent {
    /// The turn.
    pub turn_id: String,
    /// The call waiting; answer with an `approval` op naming it.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// The arguments as the model wrote them.
    pub arguments: String,
}

/// Payload of [`EventMsg::ApprovalDecided`]; the envelope's `submission_id`
/// is the approval op's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalDecidedEvent {
    /// The turn.
    pub turn_id: String,
    /// The call decided.
    pub call_id: String,
    /// The decision.
    pub decision: super::ApprovalDecision,
    /// Who decided: the principal that sent the approval (absent in logs
    /// written before principals existed, and for decisions the runtime
    /// made itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<crate::Actor>,
}

/// Payload of [`EventMsg::ToolCallStarted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCallStartedEvent {
    /// The turn.
    pub turn_id: String,
    /// The provider's id for the call.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// The arguments as the model wrote them (JSON text, possibly malformed).
    pub arguments: String,
}

/// Payload of [`EventMsg::ToolCallCompleted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCallCompletedEvent {
    /// The turn.
    pub turn_id: String,
    /// The call.
    pub call_id: String,
    /// What goes back to the model: the result, or the error message.
    pub output: String,
    /// Whether the call failed.
    pub is_error: bool,
}

/// Payload of [`EventMsg::ToolCallProgress`]. Reports are coalesced: a
/// call's latest at most every 100 ms, and its last before its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCallProgressEvent {
    /// The turn.
    pub turn_id: String,
    /// The running call.
    pub call_id: String,
    /// The progress so far; it grows with each report.
    pub progress: f64,
    /// The total it goes up to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// What the tool is doing, in its words (at most 1 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Payload of [`EventMsg::ModelChanged`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelChangedEvent {
    /// The model spec before the change (`None`: the server's default of
    /// the time, which the session did not record).
    pub previous: Option<String>,
    /// The model spec that answers from now on.
    pub model: String,
}

/// Payload of [`EventMsg::ToolsChanged`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolsChangedEvent {
    /// The turn whose next model step sees the change.
    pub turn_id: String,
    /// The names of the tools now offered, sorted.
    pub tools: Vec<String>,
    /// The names that came.
    pub added: Vec<String>,
    /// The names that went.
    pub removed: Vec<String>,
}

/// Payload of [`EventMsg::ContextCompacted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextCompactedEvent {
    /// The turn it happened in; `None` when asked for between turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// What set it off.
    pub reason: CompactionReason,
    /// The summary the model sees in place of the replaced items.
    pub summary: String,
    /// The history items it replaces, `[from, to)` by position in the
    /// session's full history (it covers any earlier summary too, so `from`
    /// is 0).
    pub replaced_from: u64,
    /// The end (exclusive) of the replaced items; the model sees the items
    /// from here on after the summary.
    pub replaced_to: u64,
    /// The estimated tokens of a request before compacting.
    pub tokens_before: u64,
    /// The estimated tokens of a request after compacting.
    pub tokens_after: u64,
    /// How long asking for the summary took, in milliseconds.
    pub duration_ms: u64,
    /// The tokens the summary request used, when the provider reported
    /// them; they count in the session's usage like a model step's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<super::TokenUsage>,
}

/// Payload of [`EventMsg::TurnRolledBack`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnRolledBackEvent {
    /// The turn that was undone (it had ended before).
    pub rolled_back_turn_id: String,
    /// The history's length before that turn: it is cut back to this many
    /// items.
    pub history_from: u64,
    /// How many history items left it.
    pub items_removed: u64,
    /// Whether the latest compaction summarized part of the undone turn and
    /// was dropped with it (the next request compacts again if it must).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compaction_undone: bool,
}

/// Why the history was compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CompactionReason {
    /// The next request would pass the context threshold.
    Threshold,
    /// A client asked (the `compact` op).
    Requested,
    /// The provider refused a request as too long for its context.
    ContextLengthExceeded,
}

/// Payload of [`EventMsg::TokenUsage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenUsageEvent {
    /// The turn.
    pub turn_id: String,
    /// The model step, from 1.
    pub step: u32,
    /// What this step used.
    pub usage: super::TokenUsage,
    /// What the session has used so far, this step included.
    pub session_total: super::TokenUsage,
}

/// Payload of [`EventMsg::AssistantMessage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AssistantMessageEvent {
    /// The turn.
    pub turn_id: String,
    /// The complete message.
    pub text: String,
    /// The message's id: its step's `model_step_started.message_id`.
    /// Absent in logs written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

/// Payload of [`EventMsg::TurnComplete`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnCompleteEvent {
    /// The turn.
    pub turn_id: String,
    /// Whether the turn's last answer was cut off at the model's output
    /// length limit (`max_output_tokens`): complete as a turn, not as an
    /// answer. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub length_limited: bool,
}

/// Why a turn ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AbortReason {
    /// An interrupt op stopped it.
    Interrupted,
    /// The runtime stopped (process exit or crash) while the turn ran; found
    /// and closed when the session was next opened.
    RuntimeStopped,
    /// The model failed.
    ModelFailed,
    /// The model produced output faster than the store could record it, past
    /// the recorder's bounds.
    RecorderSaturated,
    /// A token budget of the session or its tenant was spent; checked
    /// before each model step.
    BudgetExhausted,
}

/// Payload of [`EventMsg::TurnAborted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnAbortedEvent {
    /// The turn.
    pub turn_id: String,
    /// Why it ended.
    pub reason: AbortReason,
    /// The same, for people.
    pub message: String,
}

/// Payload of [`EventMsg::Warning`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WarningEvent {
    /// What to know.
    pub message: String,
}

/// Payload of [`EventMsg::Error`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorEvent {
    /// The turn that failed, if the error belongs to one.
    pub turn_id: Option<String>,
    /// What failed.
    pub message: String,
}

/// Payload of [`EventMsg::SubmissionQueued`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmissionQueuedEvent {
    /// The op, as it will run.
    pub op: Op,
    /// What it does if the session is busy.
    pub on_busy: BusyPolicy,
    /// The client's idempotency key, if it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Who submitted it (absent in logs written before principals existed,
    /// and for submissions made by an embedding program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<crate::Actor>,
    /// The caller's W3C `traceparent`, when the request carried one: the
    /// turn this submission starts runs in that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Payload of [`EventMsg::SubmissionRejected`]; the envelope's
/// `submission_id` names the submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmissionRejectedEvent {
    /// Why it will not be acted on.
    pub reason: String,
    /// The client's idempotency key, when a refused submission carried
    /// one: the key stays taken, so a retry is refused the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// Payload of [`EventMsg::ShutdownComplete`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShutdownCompleteEvent {}
