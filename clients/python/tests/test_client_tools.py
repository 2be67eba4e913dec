"""A client tool round trip: the turn waits for the client's result, which goes to the model."""

from __future__ import annotations

import pytest
from conftest import TOKEN, KeelServer

from keel_client import ClientToolSpec, Keel, NotFound, events

PICK = ClientToolSpec(
    name="pick_color",
    description="Asks the user to pick a color.",
    parameters={"type": "object", "properties": {"hint": {"type": "string"}}},
)

PICK_THEN_ANSWER = [
    {"text": "Let me ask.", "tool_calls": [{"name": "pick_color", "arguments": {"hint": "warm"}}]},
    {"text": "Orange it is."},
]


def test_a_client_tool_round_trip(server: KeelServer) -> None:
    spec = server.script("pick.jsonl", PICK_THEN_ANSWER)
    with Keel(server.url, token=TOKEN) as keel:
        session = keel.sessions.create(model=spec, client_tools=[PICK]).id
        assert keel.sessions.get(session).client_tools == [
            ClientToolSpec(name=PICK.name, description=PICK.description, parameters=PICK.parameters)
        ]
        asked = keel.wait_for_turn(session, keel.submit(session, "Pick one."), stop_at_approval=True, timeout=30)
        request = asked.end.msg
        assert isinstance(request, events.ClientToolRequested) and request.name == "pick_color"
        assert '"warm"' in request.arguments
        waiting = keel.sessions.get(session)
        assert waiting.state == "awaiting_client_tool" and waiting.pending_client_tools == [request.call_id]
        answered = keel.answer_client_tool(session, request.call_id, "orange")
        turn = keel.wait_for_turn(session, answered, timeout=30)
        assert turn.completed and turn.turn_id == asked.turn_id and turn.text == "Orange it is."
        results = [e.msg for e in turn.events if isinstance(e.msg, events.ToolCallCompleted)]
        assert [(r.call_id, r.output, r.is_error) for r in results] == [(request.call_id, "orange", False)]
        # Nothing waits any more: an answer for a call never made is `404`.
        with pytest.raises(NotFound) as refused:
            keel.answer_client_tool(session, "no-such-call", "x")
        assert refused.value.code == "unknown_tool_call"
