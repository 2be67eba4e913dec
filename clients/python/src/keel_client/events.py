"""The events of a session's log: the envelope (`Event`) and one dataclass
per ``EventMsg`` variant of the protocol (crates/keel-protocol), named after
the Rust payload without its ``Event`` suffix.

A variant this client does not know (a newer server) arrives as
`UnknownEvent`, so a stream never breaks on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

from ._convert import from_json, register
from .models import Actor, BusyPolicy, Decision, Op, TokenUsage


@dataclass(frozen=True)
class SandboxInfo:
    """The sandbox a session's shell commands run under."""

    policy: str
    enforced: bool
    detail: str
    network_blocked: bool = False


@dataclass(frozen=True)
class SessionStarted:
    """A runtime opened the session (new or resumed)."""

    TYPE: ClassVar[str] = "session_started"
    session_id: str
    bot_id: str
    resumed: bool
    history_items: int
    pending_approvals: list[str] = field(default_factory=list)
    sandbox: SandboxInfo | None = None
    tools: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SessionForked:
    """The first event of a fork: its history is the parent's at `at_sequence`."""

    TYPE: ClassVar[str] = "session_forked"
    parent_session_id: str
    at_sequence: int
    history_items: int


@dataclass(frozen=True)
class TurnStarted:
    """A turn began."""

    TYPE: ClassVar[str] = "turn_started"
    turn_id: str
    trace_id: str | None = None


@dataclass(frozen=True)
class UserMessage:
    """A user message joined a turn; the envelope names its submission."""

    TYPE: ClassVar[str] = "user_message"
    turn_id: str
    text: str


@dataclass(frozen=True)
class ModelStepStarted:
    """The model was called for a step of the turn."""

    TYPE: ClassVar[str] = "model_step_started"
    turn_id: str
    step: int
    message_id: str | None = None


@dataclass(frozen=True)
class AssistantContentDelta:
    """Streamed assistant text, to append to what came before."""

    TYPE: ClassVar[str] = "assistant_content_delta"
    turn_id: str
    delta: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Streamed reasoning text, for display."""

    TYPE: ClassVar[str] = "reasoning_delta"
    turn_id: str
    delta: str


@dataclass(frozen=True)
class AssistantMessage:
    """The assistant's complete message for a step."""

    TYPE: ClassVar[str] = "assistant_message"
    turn_id: str
    text: str
    message_id: str | None = None


@dataclass(frozen=True)
class ApprovalRequested:
    """A tool call waits for a decision (`Keel.approve`)."""

    TYPE: ClassVar[str] = "approval_requested"
    turn_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ApprovalDecided:
    """The user decided about a tool call."""

    TYPE: ClassVar[str] = "approval_decided"
    turn_id: str
    call_id: str
    decision: Decision
    decided_by: Actor | None = None


@dataclass(frozen=True)
class ToolCallStarted:
    """The model asked for a tool call, which is about to run."""

    TYPE: ClassVar[str] = "tool_call_started"
    turn_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ClientToolRequested:
    """The model called a tool the client executes; answer with a ``ClientToolResult`` op."""

    TYPE: ClassVar[str] = "client_tool_requested"
    turn_id: str
    call_id: str
    name: str
    arguments: str
    expires_at_ms: int | None = None


@dataclass(frozen=True)
class ToolCallCompleted:
    """A tool call finished (or failed, `is_error`)."""

    TYPE: ClassVar[str] = "tool_call_completed"
    turn_id: str
    call_id: str
    output: str
    is_error: bool


@dataclass(frozen=True)
class ToolCallProgress:
    """A running tool call reported how far it got."""

    TYPE: ClassVar[str] = "tool_call_progress"
    turn_id: str
    call_id: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True)
class ToolsChanged:
    """The tools offered to the model changed."""

    TYPE: ClassVar[str] = "tools_changed"
    turn_id: str
    tools: list[str]
    added: list[str]
    removed: list[str]


@dataclass(frozen=True)
class ModelChanged:
    """The session's model was changed between turns; later turns are answered by ``model``."""

    TYPE: ClassVar[str] = "model_changed"
    model: str
    previous: str | None = None


@dataclass(frozen=True)
class TokenUsageReported:
    """Tokens a model step used, and the session's totals (``token_usage``)."""

    TYPE: ClassVar[str] = "token_usage"
    turn_id: str
    step: int
    usage: TokenUsage
    session_total: TokenUsage


@dataclass(frozen=True)
class TurnComplete:
    """The turn ended normally."""

    TYPE: ClassVar[str] = "turn_complete"
    turn_id: str
    length_limited: bool = False


@dataclass(frozen=True)
class TurnAborted:
    """The turn ended early; `reason` says why."""

    TYPE: ClassVar[str] = "turn_aborted"
    turn_id: str
    reason: Literal["interrupted", "runtime_stopped", "model_failed", "recorder_saturated"]
    message: str


@dataclass(frozen=True)
class Warning:  # noqa: A001 - the protocol's name
    """Something worth knowing that did not stop anything."""

    TYPE: ClassVar[str] = "warning"
    message: str


@dataclass(frozen=True)
class Error:
    """Something failed; if it ended a turn, a `TurnAborted` follows."""

    TYPE: ClassVar[str] = "error"
    message: str
    turn_id: str | None = None


@dataclass(frozen=True)
class SubmissionRejected:
    """A submission was accepted but will not be acted on."""

    TYPE: ClassVar[str] = "submission_rejected"
    reason: str
    #: The refused request's ``Idempotency-Key``, which stays taken by it.
    idempotency_key: str | None = None


@dataclass(frozen=True)
class SubmissionQueued:
    """A submission was stored before being queued; the envelope's id is its id."""

    TYPE: ClassVar[str] = "submission_queued"
    op: Op
    on_busy: BusyPolicy
    idempotency_key: str | None = None
    submitted_by: Actor | None = None
    traceparent: str | None = None


@dataclass(frozen=True)
class ShutdownComplete:
    """The runtime stopped; the last event of that runtime."""

    TYPE: ClassVar[str] = "shutdown_complete"


@dataclass(frozen=True)
class ContextCompacted:
    """The older history was replaced, for the model, by a summary."""

    TYPE: ClassVar[str] = "context_compacted"
    reason: Literal["threshold", "requested", "context_length_exceeded"]
    summary: str
    replaced_from: int
    replaced_to: int
    tokens_before: int
    tokens_after: int
    duration_ms: int
    turn_id: str | None = None
    usage: TokenUsage | None = None


@dataclass(frozen=True)
class TurnRolledBack:
    """The last turn was rolled back (a ``regenerate``)."""

    TYPE: ClassVar[str] = "turn_rolled_back"
    rolled_back_turn_id: str
    history_from: int
    items_removed: int
    compaction_undone: bool = False


@dataclass(frozen=True)
class InstructionSource:
    """One ``AGENTS.md`` file a session read its project instructions from."""

    path: str
    bytes: int
    sha256: str
    truncated: bool = False


@dataclass(frozen=True)
class InstructionsLoaded:
    """The project instructions (``AGENTS.md``) read at the session's first turn, kept for the session."""

    TYPE: ClassVar[str] = "instructions_loaded"
    sources: list[InstructionSource] = field(default_factory=list)
    text: str = ""
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UnknownEvent:
    """A variant this client does not know: its tag and its fields as sent."""

    type: str
    data: dict[str, Any]


EVENT_TYPES: dict[str, type] = {
    cls.TYPE: cls
    for cls in (
        SessionStarted,
        SessionForked,
        TurnStarted,
        UserMessage,
        ModelStepStarted,
        AssistantContentDelta,
        ReasoningDelta,
        AssistantMessage,
        ApprovalRequested,
        ApprovalDecided,
        ToolCallStarted,
        ClientToolRequested,
        ToolCallCompleted,
        ToolCallProgress,
        ToolsChanged,
        TokenUsageReported,
        TurnComplete,
        TurnAborted,
        Warning,
        Error,
        SubmissionRejected,
        SubmissionQueued,
        ShutdownComplete,
        ContextCompacted,
        TurnRolledBack,
        ModelChanged,
        InstructionsLoaded,
    )
}
"""Each variant's dataclass, by its ``type`` tag."""

EventMsg = Union[
    SessionStarted,
    SessionForked,
    TurnStarted,
    UserMessage,
    ModelStepStarted,
    AssistantContentDelta,
    ReasoningDelta,
    AssistantMessage,
    ApprovalRequested,
    ApprovalDecided,
    ToolCallStarted,
    ClientToolRequested,
    ToolCallCompleted,
    ToolCallProgress,
    ToolsChanged,
    TokenUsageReported,
    TurnComplete,
    TurnAborted,
    Warning,
    Error,
    SubmissionRejected,
    SubmissionQueued,
    ShutdownComplete,
    ContextCompacted,
    TurnRolledBack,
    ModelChanged,
    InstructionsLoaded,
    UnknownEvent,
]
"""What happened: one of the variants above."""


def msg_from_json(value: Any) -> Any:
    """An ``EventMsg`` from its JSON (`UnknownEvent` for an unknown tag)."""
    tag = str(value.get("type")) if isinstance(value, dict) else "?"
    cls = EVENT_TYPES.get(tag)
    if cls is None:
        return UnknownEvent(type=tag, data=dict(value) if isinstance(value, dict) else {})
    return from_json(cls, value)


register(EventMsg, msg_from_json)


@dataclass(frozen=True)
class Event:
    """An event as recorded in the session's log (`RecordedEvent`)."""

    sequence: int
    recorded_at_ms: int
    msg: EventMsg
    submission_id: str | None = None

    @property
    def type(self) -> str:
        """The variant's tag, as on the wire (``turn_complete``, …)."""
        msg = self.msg
        return msg.type if isinstance(msg, UnknownEvent) else msg.TYPE

    @property
    def turn_id(self) -> str | None:
        """The turn the event belongs to, if any."""
        return getattr(self.msg, "turn_id", None)


def event_from_json(value: Any) -> Event:
    """A recorded event from its JSON."""
    return from_json(Event, value)


@dataclass(frozen=True)
class EventPage:
    """A page of the log, oldest first (`EventsView`)."""

    events: list[Event]
    has_more: bool
