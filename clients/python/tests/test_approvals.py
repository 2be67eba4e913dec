"""An approval round trip: the turn stops at a tool call, the decision resumes it."""

from __future__ import annotations

import asyncio

from conftest import TOKEN, KeelServer

from keel_client import AsyncKeel, Keel, SubmissionRejected, events

CLOCK_THEN_ANSWER = [
    {"text": "Let me look.", "tool_calls": [{"name": "clock", "arguments": {}}]},
    {"text": "It is late."},
]


def test_an_approval_round_trip(server: KeelServer) -> None:
    spec = server.script("clock.jsonl", CLOCK_THEN_ANSWER)
    with Keel(server.url, token=TOKEN) as keel:
        session = keel.sessions.create(model=spec, approvals={"tools": {"clock": "ask"}}).id
        asked = keel.wait_for_turn(session, keel.submit(session, "What time is it?"), stop_at_approval=True)
        request = asked.end.msg
        assert isinstance(request, events.ApprovalRequested) and request.name == "clock"
        assert keel.sessions.get(session).pending_approvals == [request.call_id]
        decided = keel.approve(session, request.call_id, "approve")
        turn = keel.wait_for_turn(session, decided, timeout=30)
        assert turn.completed and turn.turn_id == asked.turn_id
        kinds = [type(e.msg) for e in turn.events]
        assert kinds[0] is events.ApprovalDecided
        assert events.ToolCallCompleted in kinds
        assert turn.text == "It is late."
        # The same decision again finds nothing waiting.
        again = keel.approve(session, request.call_id, "approve")
        try:
            keel.wait_for_turn(session, again, timeout=30)
        except SubmissionRejected as rejected:
            assert request.call_id in rejected.message
        else:
            raise AssertionError("a second decision is rejected")


def test_a_denied_call_async(server: KeelServer) -> None:
    spec = server.script("clock-deny.jsonl", CLOCK_THEN_ANSWER)

    async def flow() -> None:
        async with AsyncKeel(server.url, token=TOKEN) as keel:
            session = (await keel.sessions.create(model=spec, approvals={"tools": {"clock": "ask"}})).id
            accepted = await keel.submit(session, "Time?")
            asked = await keel.wait_for_turn(session, accepted, stop_at_approval=True, timeout=30)
            assert isinstance(asked.end.msg, events.ApprovalRequested)
            decided = await keel.approve(session, asked.end.msg.call_id, "deny")
            turn = await keel.wait_for_turn(session, decided, timeout=30)
            assert turn.completed
            decision = turn.events[0].msg
            assert isinstance(decision, events.ApprovalDecided) and decision.decision == "deny"
            results = [e.msg for e in turn.events if isinstance(e.msg, events.ToolCallCompleted)]
            assert results and results[0].is_error

    asyncio.run(flow())
