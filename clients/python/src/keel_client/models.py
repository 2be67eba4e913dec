"""Request and response bodies of the HTTP API (docs/http-api.md), typed by
hand and checked against the OpenAPI document (docs/openapi.json) by the
tests: each dataclass's fields, and which of them are required, are the
schema's.

Fields with a default are the ones the schema does not require (``None``
stands for a field sent as ``null`` or left out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

from ._convert import from_json, register

BusyPolicy = Literal["queue", "interrupt", "reject", "steer"]
"""What a ``user_input`` does while the session is busy."""

QueueMode = Literal["merge", "each"]
"""How the messages waiting in a session's queue become turns: all in one, or one each."""

Decision = Literal["approve", "approve_for_session", "deny"]
"""An answer to a tool call that waits for approval."""

ActorKind = Literal["operator", "api_key", "jwt"]
"""How a principal authenticated."""


@dataclass(frozen=True)
class Actor:
    """Who made a submission or decided an approval (the audit trail)."""

    tenant: str
    principal_id: str
    kind: ActorKind
    name: str | None = None

SandboxPolicy = Literal["read-only", "workspace-write", "full-access"]
"""How tightly a session's shell commands are confined."""

ApprovalPolicy = Literal["auto", "ask", "deny"]
"""Whether a tool's calls run without asking, ask first, or never run."""


# --- Ops: what a client submits ------------------------------------------------


@dataclass(frozen=True)
class UserInput:
    """A user message: starts a turn, or waits for the next one."""

    TYPE: ClassVar[str] = "user_input"
    text: str


@dataclass(frozen=True)
class Steer:
    """A user message for the running turn (``user_input`` with ``on_busy: steer``)."""

    TYPE: ClassVar[str] = "steer"
    text: str


@dataclass(frozen=True)
class Interrupt:
    """Aborts the running turn (only `turn_id`, when given)."""

    TYPE: ClassVar[str] = "interrupt"
    turn_id: str | None = None


@dataclass(frozen=True)
class Approval:
    """Answers an ``approval_requested`` event."""

    TYPE: ClassVar[str] = "approval"
    call_id: str
    decision: Decision


@dataclass(frozen=True)
class ClientToolResult:
    """Answers a ``client_tool_requested`` event with what the client's tool returned."""

    TYPE: ClassVar[str] = "client_tool_result"
    call_id: str
    output: str
    is_error: bool = False


@dataclass(frozen=True)
class Shutdown:
    """Stops the session's runtime after its queued work."""

    TYPE: ClassVar[str] = "shutdown"


@dataclass(frozen=True)
class Compact:
    """Summarizes the older history now, after the queued work."""

    TYPE: ClassVar[str] = "compact"


@dataclass(frozen=True)
class Regenerate:
    """Rolls the last turn back and answers its messages again."""

    TYPE: ClassVar[str] = "regenerate"


Op = Union[UserInput, Steer, Interrupt, Approval, ClientToolResult, Shutdown, Compact, Regenerate]
"""Every op of the protocol."""

OP_TYPES: dict[str, type] = {
    cls.TYPE: cls for cls in (UserInput, Steer, Interrupt, Approval, ClientToolResult, Shutdown, Compact, Regenerate)
}


def op_from_json(value: Any) -> Any:
    """An op as recorded in a ``submission_queued`` event."""
    cls = OP_TYPES.get(str(value.get("type"))) if isinstance(value, dict) else None
    if cls is None:
        return value
    return from_json(cls, value)


register(Op, op_from_json)


# --- Requests -----------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    """Overrides of the server's ``[tools]``, field by field (`ToolsOverrides`)."""

    builtin: bool | None = None
    write: bool | None = None
    shell: bool | None = None
    sandbox: SandboxPolicy | None = None
    network: bool | None = None


@dataclass(frozen=True)
class Approvals:
    """Approval rules over the server's ``[approvals]`` (`ApprovalRules`)."""

    default: ApprovalPolicy | None = None
    tools: dict[str, ApprovalPolicy] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientToolSpec:
    """A tool the client executes, as offered to the model: its name, what it does, its
    arguments' JSON Schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class CreateSession:
    """The body of ``POST /v1/sessions``; every field is optional."""

    id: str | None = None
    model: str | None = None
    bot_id: str | None = None
    tenant: str | None = None
    context: dict[str, Any] | None = None
    instructions: str | None = None
    tools: Tools | None = None
    approvals: Approvals | None = None
    on_busy: BusyPolicy | None = None
    queue_mode: QueueMode | None = None
    client_tools: list[ClientToolSpec] | None = None
    client_tool_timeout_secs: int | None = None


@dataclass(frozen=True)
class ForkSession:
    """The body of ``POST /v1/sessions/{id}/fork``: one of `at_sequence` and `before_turn`."""

    at_sequence: int | None = None
    before_turn: str | None = None
    id: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class UpdateSession:
    """The body of ``PATCH /v1/sessions/{id}``: a new title, model or list of client tools."""

    title: str | None = None
    model: str | None = None
    client_tools: list[ClientToolSpec] | None = None


@dataclass(frozen=True)
class SubmitRequest:
    """The body of ``POST /v1/sessions/{id}/submissions``."""

    op: Op
    on_busy: BusyPolicy | None = None


# --- Responses ----------------------------------------------------------------


@dataclass(frozen=True)
class TokenUsage:
    """Tokens the providers reported."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class Session:
    """A session as the API shows it (`SessionView`)."""

    id: str
    bot_id: str
    tenant: str
    context: dict[str, Any]
    on_busy: BusyPolicy
    queue_mode: QueueMode
    created_at_ms: int
    updated_at_ms: int
    last_sequence: int
    state: Literal["idle", "running", "awaiting_approval", "awaiting_client_tool"]
    queued: int
    pending_approvals: list[str]
    pending_client_tools: list[str]
    client_tools: list[ClientToolSpec]
    usage: TokenUsage
    turns_completed: int
    live: bool
    title: str | None = None
    model: str | None = None
    running_turn_id: str | None = None


@dataclass(frozen=True)
class SessionList:
    """A page of sessions, newest first; pass `next_cursor` back for the next."""

    sessions: list[Session]
    next_cursor: str | None = None


@dataclass(frozen=True)
class Accepted:
    """The answer to an accepted submission (`AcceptedView`)."""

    submission_id: str
    sequence: int
    duplicate: bool


@dataclass(frozen=True)
class SessionUsage:
    """One session's line of a usage report."""

    id: str
    bot_id: str
    usage: TokenUsage


@dataclass(frozen=True)
class BotUsage:
    """One bot's line of a usage report."""

    bot_id: str
    sessions: int
    usage: TokenUsage


@dataclass(frozen=True)
class UsageReport:
    """The answer of ``GET /v1/usage``."""

    total: TokenUsage
    bots: list[BotUsage]
    sessions: list[SessionUsage]
    bot_id: str | None = None
    since: int | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class ErrorBody:
    """An error's machine code and human message."""

    code: str
    message: str
    # With ``budget_exhausted``: the limit spent and when it resets.
    budget: dict[str, Any] | None = None
