"""The event stream's bookkeeping, free of I/O: decoding SSE lines, the
resume point, dropping what was seen, and the reconnect backoff. The sync
and async clients feed it the lines they read.
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import httpx

from ._core import Request, RetryPolicy, check_version, error_of, may_resend, retryable_status
from .errors import ConnectionFailed, KeelError
from .events import Event, event_from_json


class Reconnect(Exception):
    """The stream broke in a way a new connection mends."""


class StreamState:
    """One logical stream of a session's events across connections.

    Every event is given out once, in order: `last` is the sequence of the
    last one given out, each connection resumes after it (``Last-Event-ID``)
    and anything at or before it is dropped. A gap (a sequence past
    ``last + 1``) is never given out either: the stream reconnects from
    `last` instead.
    """

    def __init__(self, session_id: str, after: int, policy: RetryPolicy, idle_timeout: float) -> None:
        self.path = f"/v1/sessions/{quote(session_id, safe='')}/events/stream"
        self.last = after
        self.policy = policy
        self.idle_timeout = idle_timeout
        self.failures = 0
        self.deadline: float | None = None
        self._buffer = b""

    def request(self) -> Request:
        """The request that (re)opens the stream after `last`."""
        return Request(
            "GET",
            self.path,
            headers={"accept": "text/event-stream", "last-event-id": str(self.last)},
            resend_after_error=True,
        )

    def timeout(self) -> httpx.Timeout:
        """The connection's timeouts: reads may idle for `idle_timeout` (the
        server sends a keep-alive every 15 s), never past the deadline."""
        read = self.idle_timeout
        if self.deadline is not None:
            read = max(0.01, min(read, self.deadline - time.monotonic()))
        return httpx.Timeout(10.0, read=read)

    def opened(self, response: httpx.Response) -> None:
        """Checks the answer that opens a connection (its body read if it failed)."""
        check_version(response)
        if response.status_code == 200:
            return
        if retryable_status(response.status_code):
            raise Reconnect(f"the server answered {response.status_code}")
        raise error_of(response)

    def feed(self, chunk: bytes) -> list[Event]:
        """Takes bytes of the stream as they came; answers the new events they complete."""
        if not chunk:
            return []
        self.failures = 0
        buffer = self._buffer + chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        found = []
        start = 0
        while (end := buffer.find(b"\n\n", start)) >= 0:
            event = self._message(buffer[start:end])
            start = end + 2
            if event is not None:
                found.append(event)
        self._buffer = buffer[start:]
        return found

    def _message(self, block: bytes) -> Event | None:
        """One SSE message (its lines): its event, if it is new."""
        data = None
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                value = line[6:] if line[5:6] == b" " else line[5:]
                data = value if data is None else data + b"\n" + value
        if data is None:
            return None  # a comment (keep-alive)
        body = json.loads(data)
        sequence = body.get("sequence")
        if not isinstance(sequence, int):
            raise Reconnect("an event without a sequence")
        if sequence <= self.last:
            return None
        if sequence != self.last + 1:
            raise Reconnect(f"the stream skipped from {self.last} to {sequence}")
        event = event_from_json(body)
        self.last = sequence
        return event

    def check_deadline(self) -> None:
        """Raises `TimeoutError` once the deadline (if any) has passed."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeoutError("the deadline passed while waiting for events")

    def broke(self, error: Exception) -> float:
        """A connection ended (`error`): answers how long to wait before the
        next, or raises when the stream must give up."""
        self._buffer = b""
        self.check_deadline()
        if isinstance(error, KeelError):
            raise error
        if isinstance(error, httpx.TransportError) and not may_resend(error, self.request()):
            raise error
        if self.failures + 1 >= self.policy.attempts:
            raise ConnectionFailed(
                f"the event stream of {self.path} could not be resumed after sequence {self.last}: "
                f"{type(error).__name__}: {error}",
                code="connection_failed",
            ) from error
        delay = self.policy.delay(self.failures)
        self.failures += 1
        if self.deadline is not None:
            delay = max(0.0, min(delay, self.deadline - time.monotonic()))
        return delay
