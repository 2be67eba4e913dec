"""The asynchronous client, `AsyncKeel`: the same surface as `Keel`, awaited."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncGenerator, AsyncIterator, TypeVar

import httpx

from ._api import Calls
from ._core import Flow, Request, RetryPolicy, Sleep
from ._stream import Reconnect, StreamState
from .client import DEFAULT_RECONNECT, DEFAULT_RETRIES, _headers
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


class AsyncSessions:
    """``client.sessions``: create, read, list, fork, rename and delete sessions."""

    def __init__(self, client: AsyncKeel) -> None:
        self._client = client

    async def create(
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
        return await self._client._drive(
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

    async def get(self, session_id: str) -> Session:
        """One session (``GET /v1/sessions/{id}``)."""
        return await self._client._drive(self._client._calls.get_session(session_id))

    async def list(
        self, *, limit: int | None = None, cursor: str | None = None, bot_id: str | None = None
    ) -> SessionList:
        """A page of sessions, newest first; pass ``next_cursor`` as `cursor` for the next."""
        return await self._client._drive(self._client._calls.list_sessions(limit, cursor, bot_id))

    async def all(self, *, bot_id: str | None = None, page_size: int = 100) -> AsyncIterator[Session]:
        """Every session, newest first, reading page after page as it goes."""
        cursor = None
        while True:
            page = await self.list(limit=page_size, cursor=cursor, bot_id=bot_id)
            for session in page.sessions:
                yield session
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def fork(
        self,
        session_id: str,
        *,
        at_sequence: int | None = None,
        before_turn: str | None = None,
        id: str | None = None,
        message: str | None = None,
    ) -> Session:
        """A new session with `session_id`'s history at `at_sequence` (or before `before_turn`)."""
        calls = self._client._calls
        return await self._client._drive(calls.fork_session(session_id, at_sequence, before_turn, id, message))

    async def rename(self, session_id: str, title: str) -> Session:
        """Sets the session's title (``PATCH /v1/sessions/{id}``)."""
        return await self._client._drive(self._client._calls.rename_session(session_id, title))

    async def set_model(self, session_id: str, model: str) -> Session:
        """Switches the session's model from its next turn (``PATCH /v1/sessions/{id}``
        with ``model``); refused with ``session_busy`` while a turn runs."""
        return await self._client._drive(self._client._calls.set_session_model(session_id, model))

    async def set_client_tools(self, session_id: str, tools: list[ClientToolSpec]) -> Session:
        """Replaces the tools the client executes (``PATCH /v1/sessions/{id}`` with
        ``client_tools``), from the next turn; ``session_busy`` while a turn runs or waits."""
        return await self._client._drive(self._client._calls.set_session_client_tools(session_id, tools))

    async def delete(self, session_id: str, *, workspace: bool = False) -> None:
        """Deletes the session for good (its workspace too with `workspace`)."""
        await self._client._drive(self._client._calls.delete_session(session_id, workspace))


class AsyncKeel:
    """A client of one Keel server, for asyncio; see `Keel` for the arguments."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:7777",
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: RetryPolicy = DEFAULT_RETRIES,
        reconnect: RetryPolicy = DEFAULT_RECONNECT,
        stream_idle_timeout: float = 45.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self._own_http = http is None
        self._headers = _headers(token)
        self._calls = Calls(retries)
        self._reconnect = reconnect
        self._idle = stream_idle_timeout
        self.sessions = AsyncSessions(self)

    async def aclose(self) -> None:
        """Closes the connections (not an `http` client passed in)."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncKeel:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _send(self, request: Request) -> httpx.Response | Exception:
        try:
            return await self._http.request(
                request.method,
                request.path,
                params=request.params,
                json=request.json,
                headers={**self._headers, **request.headers},
            )
        except httpx.TransportError as error:
            return error

    async def _drive(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(await self._send(step))
        except StopIteration as done:
            return done.value

    async def submit(
        self,
        session_id: str,
        op: Op | str,
        *,
        on_busy: BusyPolicy | None = None,
        idempotency_key: str | None = None,
    ) -> Accepted:
        """Submits an op once; see `Keel.submit`."""
        return await self._drive(self._calls.submit(session_id, op, on_busy, idempotency_key))

    async def approve(self, session_id: str, call_id: str, decision: Decision = "approve") -> Accepted:
        """Decides a tool call waiting for approval."""
        return await self._drive(self._calls.approve(session_id, call_id, decision))

    async def answer_client_tool(
        self, session_id: str, call_id: str, output: str, *, is_error: bool = False
    ) -> Accepted:
        """Answers a ``client_tool_requested`` call with the client's result (or error)."""
        return await self._drive(self._calls.answer_client_tool(session_id, call_id, output, is_error))

    async def interrupt(self, session_id: str, turn_id: str | None = None) -> Accepted:
        """Aborts the running turn (only `turn_id`, when given)."""
        return await self.submit(session_id, Interrupt(turn_id=turn_id))

    async def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
    ) -> EventPage:
        """A page of the log: after `after`, or the newest before `before`."""
        return await self._drive(self._calls.events_page(session_id, after, before, limit))

    async def usage(self, *, bot_id: str | None = None, since: int | None = None) -> UsageReport:
        """Tokens used, per session, per bot and in all."""
        return await self._drive(self._calls.usage(bot_id, since))

    def stream(self, session_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The session's events after `after`, live, forever; see `Keel.stream`."""
        return self._stream(StreamState(session_id, after, self._reconnect, self._idle))

    async def _stream(self, state: StreamState) -> AsyncGenerator[Event, None]:
        while True:
            request = state.request()
            try:
                headers = {**self._headers, **request.headers}
                async with self._http.stream("GET", request.path, headers=headers, timeout=state.timeout()) as response:
                    if response.status_code != 200:
                        await response.aread()
                    state.opened(response)
                    async for chunk in response.aiter_bytes():
                        for event in state.feed(chunk):
                            yield event
                            state.check_deadline()
                raise Reconnect("the server ended the stream")
            except (httpx.TransportError, Reconnect) as error:
                await asyncio.sleep(state.broke(error))

    async def wait_for_turn(
        self,
        session_id: str,
        accepted: Accepted,
        *,
        timeout: float | None = None,
        stop_at_approval: bool = False,
    ) -> TurnResult:
        """Waits until the turn `accepted`'s submission started (or joined) ends; see `Keel.wait_for_turn`."""
        tracker = TurnTracker(accepted, stop_at_approval)
        state = StreamState(session_id, tracker.start_after(accepted), self._reconnect, self._idle)
        if timeout is not None:
            state.deadline = time.monotonic() + timeout
        events = self._stream(state)
        try:
            async for event in events:
                result = tracker.feed(event)
                if result is not None:
                    return result
        finally:
            await events.aclose()
        raise AssertionError("an event stream does not end")
