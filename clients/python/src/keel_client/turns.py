"""Following one submission to the end of the turn it started (or joined)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SubmissionRejected
from .events import (
    ApprovalDecided,
    ApprovalRequested,
    AssistantMessage,
    ClientToolRequested,
    ContextCompacted,
    Event,
    ShutdownComplete,
    ToolCallCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UserMessage,
)
from .events import SubmissionRejected as Rejected
from .models import Accepted

# The events by which a submission's turn is known: it started the turn, its
# message joined one, or its decision resumed one.
_JOINS = (TurnStarted, UserMessage, ApprovalDecided, ToolCallCompleted)


@dataclass
class TurnResult:
    """How a submission's turn ended.

    `end` is the event that ended it (`TurnComplete` or `TurnAborted`; for
    an op that runs no turn, its last event, such as `ContextCompacted`),
    or an `ApprovalRequested` / `ClientToolRequested` when waiting stopped
    at one (the turn waits for a person). `events` are the
    turn's events from the submission on.
    """

    turn_id: str | None
    end: Event
    events: list[Event] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """Whether the turn ended normally."""
        return isinstance(self.end.msg, TurnComplete)

    @property
    def aborted(self) -> bool:
        """Whether the turn ended early (see ``end.msg.reason``)."""
        return isinstance(self.end.msg, TurnAborted)

    @property
    def text(self) -> str:
        """The assistant's messages of the turn, one per model step, joined."""
        return "\n".join(event.msg.text for event in self.events if isinstance(event.msg, AssistantMessage))


class TurnTracker:
    """Finds the turn of one submission in a stream of events and its end.

    The turn is the one whose first event carrying the submission's id names
    it (the ``turn_started`` or ``user_message`` of a message, the
    ``approval_decided`` of an approval, the ``tool_call_completed`` of a
    client tool's result).
    """

    def __init__(self, accepted: Accepted, stop_at_approval: bool = False) -> None:
        self.submission_id = accepted.submission_id
        self.stop_at_approval = stop_at_approval
        self.turn_id: str | None = None
        self.events: list[Event] = []

    def feed(self, event: Event) -> TurnResult | None:
        """Takes the next event; answers the result once the turn ended."""
        mine = event.submission_id == self.submission_id
        if self.turn_id is None:
            if not mine:
                return None
            if isinstance(event.msg, Rejected):
                raise SubmissionRejected(event.msg.reason, code="submission_rejected")
            self.events.append(event)
            if isinstance(event.msg, _JOINS):
                self.turn_id = event.turn_id
            elif event.turn_id is None and isinstance(event.msg, (ContextCompacted, ShutdownComplete)):
                return TurnResult(None, event, self.events)
            return None
        if event.turn_id != self.turn_id:
            return None
        self.events.append(event)
        msg = event.msg
        if isinstance(msg, (TurnComplete, TurnAborted)):
            return TurnResult(self.turn_id, event, self.events)
        if self.stop_at_approval and isinstance(msg, (ApprovalRequested, ClientToolRequested)):
            return TurnResult(self.turn_id, event, self.events)
        return None

    def start_after(self, accepted: Accepted) -> int:
        """Where the stream starts: just before the submission's sequence."""
        return max(0, accepted.sequence - 1)
