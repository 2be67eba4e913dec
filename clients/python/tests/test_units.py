"""The client's I/O-free parts: SSE decoding and resume bookkeeping, retry delays."""

from __future__ import annotations

import json

import pytest

from keel_client import RetryPolicy, events
from keel_client._stream import Reconnect, StreamState


def message(sequence: int, msg: dict | None = None) -> bytes:
    body = {
        "sequence": sequence,
        "recorded_at_ms": 1,
        "submission_id": None,
        "msg": msg or {"type": "warning", "message": f"w{sequence}"},
    }
    return f"id: {sequence}\nevent: x\ndata: {json.dumps(body)}\n\n".encode()


def state(after: int = 0) -> StreamState:
    return StreamState("s", after, RetryPolicy(attempts=3), 45.0)


def test_events_split_anywhere_come_out_once_in_order() -> None:
    stream = b": keep-alive\n\n" + b"".join(message(n) for n in range(1, 6))
    for size in (1, 2, 7, 64, len(stream)):
        reader = state()
        got = []
        for start in range(0, len(stream), size):
            got += reader.feed(stream[start : start + size])
        assert [e.sequence for e in got] == [1, 2, 3, 4, 5], size
        assert all(isinstance(e.msg, events.Warning) for e in got)


def test_crlf_lines_and_multi_line_data_are_read() -> None:
    body = json.dumps(
        {"sequence": 1, "recorded_at_ms": 1, "submission_id": None, "msg": {"type": "shutdown_complete"}}, indent=1
    )
    block = "".join(f"data: {line}\r\n" for line in body.splitlines()) + "\r\n"
    (event,) = state().feed(block.encode())
    assert isinstance(event.msg, events.ShutdownComplete)


def test_seen_events_are_dropped_and_a_gap_reconnects() -> None:
    reader = state(after=2)
    assert reader.feed(message(1) + message(2)) == []
    assert [e.sequence for e in reader.feed(message(3))] == [3]
    with pytest.raises(Reconnect):
        reader.feed(message(5))
    assert reader.last == 3
    assert reader.request().headers["last-event-id"] == "3"


def test_an_unknown_event_type_is_kept_not_fatal() -> None:
    (event,) = state().feed(message(1, {"type": "from_the_future", "x": 1}))
    assert isinstance(event.msg, events.UnknownEvent) and event.msg.data["x"] == 1
    assert event.type == "from_the_future"


def test_reconnects_are_bounded_and_reset_by_traffic() -> None:
    reader = state()
    reader.broke(Reconnect("one"))
    reader.broke(Reconnect("two"))
    reader.feed(b": keep-alive\n\n")
    reader.broke(Reconnect("three"))
    reader.broke(Reconnect("four"))
    with pytest.raises(Exception, match="could not be resumed"):
        reader.broke(Reconnect("five"))


def test_retry_delays_double_up_to_the_cap_and_honour_retry_after() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0, max_retry_after=5.0)
    for retry, ceiling in enumerate([0.1, 0.2, 0.4, 0.8, 1.0, 1.0]):
        assert ceiling / 2 <= policy.delay(retry) <= ceiling
    assert policy.delay(0, retry_after=3.0) == 3.0
    assert policy.delay(0, retry_after=60.0) == 5.0
