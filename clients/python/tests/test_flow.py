"""The README's flow, run as a user would, and the sessions' surface, sync and async."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import TOKEN, KeelServer

from keel_client import AsyncKeel, Keel, NotFound, events

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_example_runs_against_a_server(server: KeelServer) -> None:
    example = re.search(r"## Ten lines\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert example is not None, "the README has its ten-line example"
    assert len(example.group(1).strip().splitlines()) <= 12
    env = {**os.environ, "KEEL_URL": server.url, "KEEL_TOKEN": TOKEN}
    run = subprocess.run([sys.executable, "-c", example.group(1)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "Hello from the default script."
    assert lines[1] == "1 session_started"
    assert lines[-1].endswith(" turn_complete"), lines


def test_a_sessions_model_is_switched_between_turns(server: KeelServer) -> None:
    with Keel(server.url, token=TOKEN) as keel:
        created = keel.sessions.create("flow-model")
        first = keel.wait_for_turn(created.id, keel.submit(created.id, "Hi"), timeout=30)
        assert first.text == "Hello from the default script."
        # A script goes on from the session's count of model calls: one filler line.
        other = server.script("other.jsonl", [{"text": "unused"}, {"text": "From the other model."}])
        switched = keel.sessions.set_model(created.id, other)
        assert switched.model is not None and switched.model.endswith("other.jsonl"), switched.model
        assert keel.sessions.get(created.id).model == switched.model
        second = keel.wait_for_turn(created.id, keel.submit(created.id, "Again"), timeout=30)
        assert second.text == "From the other model."
        changed = [e.msg for e in keel.events(created.id, after=0).events if isinstance(e.msg, events.ModelChanged)]
        assert len(changed) == 1 and changed[0].model == switched.model


def test_sessions_round_trip_sync(server: KeelServer) -> None:
    with Keel(server.url, token=TOKEN) as keel:
        created = keel.sessions.create("flow-sync", bot_id="bot-a", context={"user": "u-1"}, on_busy="queue")
        assert (created.id, created.bot_id, created.context, created.state) == (
            "flow-sync",
            "bot-a",
            {"user": "u-1"},
            "idle",
        )
        accepted = keel.submit(created.id, "Hi there")
        assert not accepted.duplicate
        turn = keel.wait_for_turn(created.id, accepted, timeout=30)
        assert turn.completed and turn.text == "Hello from the default script."
        assert isinstance(turn.end.msg, events.TurnComplete)
        shown = keel.sessions.get(created.id)
        assert shown.title == "Hi there" and shown.turns_completed == 1
        assert keel.sessions.rename(created.id, "Renamed").title == "Renamed"
        assert [s.id for s in keel.sessions.list(bot_id="bot-a").sessions] == ["flow-sync"]
        page = keel.events(created.id, after=0)
        assert [e.sequence for e in page.events] == list(range(1, shown.last_sequence + 1))
        assert isinstance(page.events[0].msg, events.SessionStarted)
        queued = page.events[1].msg
        assert isinstance(queued, events.SubmissionQueued) and queued.op.text == "Hi there"
        fork = keel.sessions.fork(created.id, at_sequence=0, id="flow-fork")
        assert fork.id == "flow-fork"
        assert keel.usage(bot_id="bot-a").bot_id == "bot-a"
        # Every session, across pages of one: the newest first.
        every = [s.id for s in keel.sessions.all(page_size=1)]
        assert every[:2] == ["flow-fork", "flow-sync"] and len(every) == len(set(every))
        keel.sessions.delete(fork.id)
        try:
            keel.sessions.get(fork.id)
        except NotFound as missing:
            assert missing.status == 404
        else:
            raise AssertionError("a deleted session is gone")


def test_sessions_round_trip_async(server: KeelServer) -> None:
    async def flow() -> None:
        async with AsyncKeel(server.url, token=TOKEN) as keel:
            created = await keel.sessions.create("flow-async")
            accepted = await keel.submit(created.id, "Hello async")
            turn = await keel.wait_for_turn(created.id, accepted, timeout=30)
            assert turn.completed and turn.text == "Hello from the default script."
            seen = []
            async for event in keel.stream(created.id):
                seen.append(event.sequence)
                if event.sequence == turn.end.sequence:
                    break
            assert seen == list(range(1, turn.end.sequence + 1))
            listing = await keel.sessions.list(limit=10)
            assert "flow-async" in [s.id for s in listing.sessions]
            every = [s.id async for s in keel.sessions.all(page_size=1)]
            assert every == [s.id for s in listing.sessions]
            fork = await keel.sessions.fork(created.id, before_turn=turn.turn_id)
            assert (await keel.sessions.get(fork.id)).id == fork.id
            assert (await keel.sessions.rename(fork.id, "Fork")).title == "Fork"
            await keel.sessions.delete(fork.id, workspace=True)
            assert (await keel.usage()).total.input_tokens >= 0

    asyncio.run(flow())
