"""The synchronous client, `Keel`."""

from __future__ import annotations

import time
from typing import Any, Generator, Iterator, TypeVar

import httpx

from ._api import Calls
from ._core import API_VERSION, Flow, Request, RetryPolicy, Sleep
from ._stream import Reconnect, StreamState
from .events import Event, EventPage
from .models import (
    Accepted,
    Approvals,
    BusyPolicy,
    ClientToolSpec,
    Decision,
    Interrupt,
    Op,
    QueueMode,
    Session,
    SessionList,
    Tools,
    UsageReport,
)
from .turns import TurnResult, TurnTracker

T = TypeVar("T")

DEFAULT_RETRIES = RetryPolicy()
"""Calls: five tries, 0.1 s doubling up to 5 s between them."""

DEFAULT_RECONNECT = RetryPolicy(attempts=30, base_delay=0.1, max_delay=2.0)
"""Streams: thirty tries in a row without a byte from the server (about a minute)."""


def _headers(token: str | None) -> dict[str, str]:
    headers = {"user-agent": f"keel-client-python/{API_VERSION}"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return headers


class Sessions:
    """``client.sessions``: create, read, list, fork, rename and delete sessions."""

    def __init__(self, client: Keel) -> None:
        self._client = client

    def create(
        self,
        id: str | None = None,
        *,
        model: str | None = None,
        bot_id: str | None = None,
        context: dict[str, Any] | None = None,
        instructions: str | None = None,
        tools: Tools | dict[str, Any] | None = None,
        approvals: Approvals | dict[str, Any] | None = None,
        on_busy: BusyPolicy | None = None,
        queue_mode: QueueMode | None = None,
        client_tools: list[ClientToolSpec] | None = None,
        client_tool_timeout_secs: int | None = None,
    ) -> Session:
        """Creates a session (``POST /v1/sessions``); every field is optional."""
        calls = self._client._calls
        return self._client._drive(
            calls.create_session(
                id,
                model,
                bot_id,
                context,
                instructions,
                tools,
                approvals,
                on_busy,
                queue_mode,
                client_tools,
                client_tool_timeout_secs,
            )
        )

    def get(self, session_id: str) -> Session:
        """One session (``GET /v1/sessions/{id}``)."""
        return self._client._drive(self._client._calls.get_session(session_id))

    def list(self, *, limit: int | None = None, cursor: str | None = None, bot_id: str | None = None) -> SessionList:
        """A page of sessions, newest first; pass ``next_cursor`` as `cursor` for the next."""
        return self._client._drive(self._client._calls.list_sessions(limit, cursor, bot_id))

    def all(self, *, bot_id: str | None = None, page_size: int = 100) -> Iterator[Session]:
        """Every session, newest first, reading page after page as it goes."""
        cursor = None
        while True:
            page = self.list(limit=page_size, cursor=cursor, bot_id=bot_id)
            yield from page.sessions
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def fork(
        self,
        session_id: str,
        *,
        at_sequence: int | None = None,
        before_turn: str | None = None,
        id: str | None = None,
        message: str | None = None,
    ) -> Session:
        """A new session with `session_id`'s history at `at_sequence` (or before `before_turn`)."""
        return self._client._drive(self._client._calls.fork_session(session_id, at_sequence, before_turn, id, message))

    def rename(self, session_id: str, title: str) -> Session:
        """Sets the session's title (``PATCH /v1/sessions/{id}``)."""
        return self._client._drive(self._client._calls.rename_session(session_id, title))

    def set_model(self, session_id: str, model: str) -> Session:
        """Switches the session's model from its next turn (``PATCH /v1/sessions/{id}``
        with ``model``); refused with ``session_busy`` while a turn runs."""
        return self._client._drive(self._client._calls.set_session_model(session_id, model))

    def set_client_tools(self, session_id: str, tools: list[ClientToolSpec]) -> Session:
        """Replaces the tools the client executes (``PATCH /v1/sessions/{id}`` with
        ``client_tools``), from the next turn; ``session_busy`` while a turn runs or waits."""
        return self._client._drive(self._client._calls.set_session_client_tools(session_id, tools))

    def delete(self, session_id: str, *, workspace: bool = False) -> None:
        """Deletes the session for good (its workspace too with `workspace`)."""
        self._client._drive(self._client._calls.delete_session(session_id, workspace))


class Keel:
    """A client of one Keel server.

    `base_url` is the server (``http://127.0.0.1:7777``), `token` its bearer
    token. `retries` bounds the retries of calls, `reconnect` those of
    streams between two signs of life. `stream_idle_timeout`: seconds a
    stream may stay silent before it is taken for dead and resumed on a new
    connection (the server sends a keep-alive every 15 s).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:7777",
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: RetryPolicy = DEFAULT_RETRIES,
        reconnect: RetryPolicy = DEFAULT_RECONNECT,
        stream_idle_timeout: float = 45.0,
        http: httpx.Client | None = None,
    ) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self._own_http = http is None
        self._headers = _headers(token)
        self._calls = Calls(retries)
        self._reconnect = reconnect
        self._idle = stream_idle_timeout
        self.sessions = Sessions(self)

    def close(self) -> None:
        """Closes the connections (not an `http` client passed in)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Keel:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, request: Request) -> httpx.Response | Exception:
        try:
            return self._http.request(
                request.method,
                request.path,
                params=request.params,
                json=request.json,
                headers={**self._headers, **request.headers},
            )
        except httpx.TransportError as error:
            return error

    def _drive(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(self._send(step))
        except StopIteration as done:
            return done.value

    def submit(
        self,
        session_id: str,
        op: Op | str,
        *,
        on_busy: BusyPolicy | None = None,
        idempotency_key: str | None = None,
    ) -> Accepted:
        """Submits an op (a string is a `UserInput`), once.

        It carries an ``Idempotency-Key`` (a new UUID unless given), the same
        on every retry after a network error or a ``503``, so a retried
        submission is queued once (the retry answers ``duplicate: true``).
        """
        return self._drive(self._calls.submit(session_id, op, on_busy, idempotency_key))

    def approve(self, session_id: str, call_id: str, decision: Decision = "approve") -> Accepted:
        """Decides a tool call waiting for approval."""
        return self._drive(self._calls.approve(session_id, call_id, decision))

    def answer_client_tool(
        self, session_id: str, call_id: str, output: str, *, is_error: bool = False
    ) -> Accepted:
        """Answers a ``client_tool_requested`` call with the client's result (or error)."""
        return self._drive(self._calls.answer_client_tool(session_id, call_id, output, is_error))

    def interrupt(self, session_id: str, turn_id: str | None = None) -> Accepted:
        """Aborts the running turn (only `turn_id`, when given)."""
        return self.submit(session_id, Interrupt(turn_id=turn_id))

    def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
    ) -> EventPage:
        """A page of the log: after `after`, or the newest before `before`."""
        return self._drive(self._calls.events_page(session_id, after, before, limit))

    def usage(self, *, bot_id: str | None = None, since: int | None = None) -> UsageReport:
        """Tokens used, per session, per bot and in all."""
        return self._drive(self._calls.usage(bot_id, since))

    def stream(self, session_id: str, *, after: int = 0) -> Iterator[Event]:
        """The session's events after `after`, live, forever.

        Resumes by itself (``Last-Event-ID``) across disconnects and server
        restarts: every event is given once, in order. Raises
        `ConnectionFailed` once the server stays away for the whole
        `reconnect` policy.
        """
        return self._stream(StreamState(session_id, after, self._reconnect, self._idle))

    def _stream(self, state: StreamState) -> Generator[Event, None, None]:
        while True:
            request = state.request()
            try:
                headers = {**self._headers, **request.headers}
                with self._http.stream("GET", request.path, headers=headers, timeout=state.timeout()) as response:
                    if response.status_code != 200:
                        response.read()
                    state.opened(response)
                    for chunk in response.iter_bytes():
                        for event in state.feed(chunk):
                            yield event
                            state.check_deadline()
                raise Reconnect("the server ended the stream")
            except (httpx.TransportError, Reconnect) as error:
                time.sleep(state.broke(error))

    def wait_for_turn(
        self,
        session_id: str,
        accepted: Accepted,
        *,
        timeout: float | None = None,
        stop_at_approval: bool = False,
    ) -> TurnResult:
        """Waits until the turn `accepted`'s submission started (or joined) ends.

        With `stop_at_approval`, returns at the turn's first
        ``approval_requested`` or ``client_tool_requested`` instead. Raises `SubmissionRejected` if the
        submission was rejected, `TimeoutError` after `timeout` seconds.
        """
        tracker = TurnTracker(accepted, stop_at_approval)
        state = StreamState(session_id, tracker.start_after(accepted), self._reconnect, self._idle)
        if timeout is not None:
            state.deadline = time.monotonic() + timeout
        events = self._stream(state)
        try:
            for event in events:
                result = tracker.feed(event)
                if result is not None:
                    return result
        finally:
            events.close()
        raise AssertionError("an event stream does not end")
