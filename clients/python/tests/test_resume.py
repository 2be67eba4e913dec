"""A stream survives `kill -9` of the server and its restart on the same
database: every event once, in order, as the log has it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import TOKEN, KeelServer

from keel_client import AsyncKeel, Event, Keel, RetryPolicy, events

MESSAGES = 3


def long_turns(server: KeelServer) -> str:
    return server.script("long.jsonl", [{"chunks": [f"part {n} " for n in range(30)], "delay_ms": 45}] * 6)


def collect_sync(url: str, session: str, out: list[Event], done: threading.Event) -> None:
    with Keel(url, token=TOKEN, reconnect=RetryPolicy(attempts=60, base_delay=0.05, max_delay=0.5)) as keel:
        for event in keel.stream(session):
            out.append(event)
            if isinstance(event.msg, events.TurnComplete):
                break
    done.set()


def collect_async(url: str, session: str, out: list[Event], done: threading.Event) -> None:
    async def run() -> None:
        reconnect = RetryPolicy(attempts=60, base_delay=0.05, max_delay=0.5)
        async with AsyncKeel(url, token=TOKEN, reconnect=reconnect) as keel:
            async for event in keel.stream(session):
                out.append(event)
                if isinstance(event.msg, events.TurnComplete):
                    break

    asyncio.run(run())
    done.set()


@pytest.mark.parametrize("collect", [collect_sync, collect_async], ids=["sync", "async"])
def test_a_stream_survives_kill_9_and_a_restart(server: KeelServer, collect) -> None:  # type: ignore[no-untyped-def]
    with Keel(server.url, token=TOKEN) as keel:
        session = keel.sessions.create("resume", model=long_turns(server)).id
        # The first starts a turn, the kill cuts it; the others wait and, after
        # the restart, run together in the next turn, the first to complete.
        for n in range(MESSAGES):
            keel.submit(session, f"message {n}")
    seen: list[Event] = []
    done = threading.Event()
    reader = threading.Thread(target=collect, args=(server.url, session, seen, done), daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not any(isinstance(e.msg, events.AssistantContentDelta) for e in seen):
        assert time.monotonic() < deadline, "the first turn streams"
        time.sleep(0.02)
    server.kill9()
    time.sleep(0.5)
    server.start()
    assert done.wait(60), f"the stream resumed and saw a turn complete: {[e.type for e in seen][-5:]}"

    with Keel(server.url, token=TOKEN) as keel:
        log = keel.events(session, after=0, limit=1000)
    last = seen[-1].sequence
    assert [e.sequence for e in seen] == list(range(1, last + 1)), "every event once, in order"
    assert seen == [e for e in log.events if e.sequence <= last], "the events the log holds"
    aborted = [e.msg for e in seen if isinstance(e.msg, events.TurnAborted)]
    assert [a.reason for a in aborted] == ["runtime_stopped"], "the cut turn was closed after the restart"
    assert sum(isinstance(e.msg, events.SessionStarted) for e in seen) >= 2, "the stream crossed a restart"
    said = [e.msg.text for e in seen if isinstance(e.msg, events.UserMessage)]
    assert said == [f"message {n}" for n in range(MESSAGES)]
