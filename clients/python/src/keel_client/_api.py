"""The API's calls as flows (see `_core`): the one definition of each call
that both clients drive.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from ._convert import from_json, to_json
from ._core import Flow, Request, RetryPolicy, call, no_body
from .events import EventPage
from .models import (
    Accepted,
    Approval,
    Approvals,
    BusyPolicy,
    ClientToolResult,
    ClientToolSpec,
    CreateSession,
    Decision,
    ForkSession,
    Interrupt,
    Op,
    QueueMode,
    Session,
    SessionList,
    Shutdown,
    SubmitRequest,
    Tools,
    UpdateSession,
    UsageReport,
    UserInput,
)


def _session_path(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def _query(**params: Any) -> dict[str, Any]:
    """Query parameters, without those left at ``None`` (booleans as JSON spells them)."""
    return {
        key: (str(value).lower() if isinstance(value, bool) else value)
        for key, value in params.items()
        if value is not None
    }


def _safe_to_resend(op: Op) -> bool:
    """Whether `op` may be sent again when its answer was lost.

    Work stored ahead is deduplicated by its key; a decision sent twice is
    recorded as rejected (no call waits any more), and so is an interrupt of
    a named turn that ended. An interrupt of whatever runs, or a shutdown,
    sent twice could stop the work that came after the first: not resent.
    """
    if isinstance(op, Interrupt):
        return op.turn_id is not None
    return not isinstance(op, Shutdown)


def _parser(cls: type) -> Any:
    return lambda body: from_json(cls, body)


class Calls:
    """Builds the flow of each call, under one retry policy."""

    def __init__(self, retries: RetryPolicy) -> None:
        self.retries = retries

    def create_session(
        self,
        id: str | None,
        model: str | None,
        bot_id: str | None,
        context: dict[str, Any] | None,
        instructions: str | None,
        tools: Tools | dict[str, Any] | None,
        approvals: Approvals | dict[str, Any] | None,
        on_busy: BusyPolicy | None,
        queue_mode: QueueMode | None = None,
        client_tools: list[ClientToolSpec] | None = None,
        client_tool_timeout_secs: int | None = None,
    ) -> Flow[Session]:
        body = CreateSession(
            id=id,
            model=model,
            bot_id=bot_id,
            context=context,
            instructions=instructions,
            tools=tools,  # type: ignore[arg-type]
            approvals=approvals,  # type: ignore[arg-type]
            on_busy=on_busy,
            queue_mode=queue_mode,
            client_tools=client_tools,
            client_tool_timeout_secs=client_tool_timeout_secs,
        )
        return call(Request("POST", "/v1/sessions", json=to_json(body)), self.retries, _parser(Session))

    def get_session(self, session_id: str) -> Flow[Session]:
        request = Request("GET", _session_path(session_id), resend_after_error=True)
        return call(request, self.retries, _parser(Session))

    def list_sessions(self, limit: int | None, cursor: str | None, bot_id: str | None) -> Flow[SessionList]:
        params = _query(limit=limit, cursor=cursor, bot_id=bot_id)
        request = Request("GET", "/v1/sessions", params=params, resend_after_error=True)
        return call(request, self.retries, _parser(SessionList))

    def fork_session(
        self,
        session_id: str,
        at_sequence: int | None,
        before_turn: str | None,
        new_id: str | None,
        message: str | None,
    ) -> Flow[Session]:
        body = ForkSession(at_sequence=at_sequence, before_turn=before_turn, id=new_id, message=message)
        request = Request("POST", _session_path(session_id, "/fork"), json=to_json(body))
        return call(request, self.retries, _parser(Session))

    def rename_session(self, session_id: str, title: str) -> Flow[Session]:
        request = Request("PATCH", _session_path(session_id), json=to_json(UpdateSession(title=title)))
        return call(request, self.retries, _parser(Session))

    def set_session_model(self, session_id: str, model: str) -> Flow[Session]:
        request = Request("PATCH", _session_path(session_id), json=to_json(UpdateSession(model=model)))
        return call(request, self.retries, _parser(Session))

    def set_session_client_tools(self, session_id: str, tools: list[ClientToolSpec]) -> Flow[Session]:
        request = Request("PATCH", _session_path(session_id), json=to_json(UpdateSession(client_tools=tools)))
        return call(request, self.retries, _parser(Session))

    def delete_session(self, session_id: str, workspace: bool) -> Flow[None]:
        params = _query(workspace=True) if workspace else None
        return no_body(Request("DELETE", _session_path(session_id), params=params), self.retries)

    def submit(
        self,
        session_id: str,
        op: Op | str,
        on_busy: BusyPolicy | None,
        idempotency_key: str | None,
    ) -> Flow[Accepted]:
        if isinstance(op, str):
            op = UserInput(text=op)
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        request = Request(
            "POST",
            _session_path(session_id, "/submissions"),
            json=to_json(SubmitRequest(op=op, on_busy=on_busy)),
            headers={"idempotency-key": key},
            resend_after_error=_safe_to_resend(op),
        )
        return call(request, self.retries, _parser(Accepted))

    def approve(self, session_id: str, call_id: str, decision: Decision) -> Flow[Accepted]:
        return self.submit(session_id, Approval(call_id=call_id, decision=decision), None, None)

    def answer_client_tool(self, session_id: str, call_id: str, output: str, is_error: bool) -> Flow[Accepted]:
        return self.submit(session_id, ClientToolResult(call_id=call_id, output=output, is_error=is_error), None, None)

    def events_page(self, session_id: str, after: int | None, before: int | None, limit: int | None) -> Flow[EventPage]:
        params = _query(after=after, before=before, limit=limit)
        request = Request("GET", _session_path(session_id, "/events"), params=params, resend_after_error=True)
        return call(request, self.retries, _parser(EventPage))

    def usage(self, bot_id: str | None, since: int | None) -> Flow[UsageReport]:
        request = Request("GET", "/v1/usage", params=_query(bot_id=bot_id, since=since), resend_after_error=True)
        return call(request, self.retries, _parser(UsageReport))
