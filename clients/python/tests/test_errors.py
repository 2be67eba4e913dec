"""Error answers become typed errors, sync and async."""

from __future__ import annotations

import asyncio

import pytest
from conftest import TOKEN, KeelServer

from keel_client import (
    AsyncKeel,
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    Keel,
    KeelError,
    NotFound,
    SessionBusy,
    Unauthorized,
    UserInput,
)
from keel_client.errors import error_for


def slow_session(keel: Keel, server: KeelServer, name: str) -> str:
    spec = server.script(f"{name}.jsonl", [{"chunks": ["slow "] * 40, "delay_ms": 100}] * 4)
    return keel.sessions.create(name, model=spec).id


def test_error_codes_are_typed_errors(server: KeelServer) -> None:
    with Keel(server.url, token=TOKEN) as keel:
        with pytest.raises(NotFound) as missing:
            keel.sessions.get("no-such-session")
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        assert "no-such-session" in missing.value.message

        session = slow_session(keel, server, "busy")
        keel.submit(session, "start a slow turn")
        with pytest.raises(SessionBusy) as busy:
            keel.submit(session, "me too", on_busy="reject")
        assert (busy.value.status, busy.value.code) == (409, "session_busy")

        keel.submit(session, "first", idempotency_key="key-1")
        again = keel.submit(session, "first", idempotency_key="key-1")
        assert again.duplicate
        with pytest.raises(IdempotencyKeyReused) as reused:
            keel.submit(session, UserInput("another text"), idempotency_key="key-1")
        assert (reused.value.status, reused.value.code) == (409, "idempotency_key_reused")

        with pytest.raises(Conflict) as exists:
            keel.sessions.create(session)
        assert exists.value.status == 409
        with pytest.raises(InvalidRequest):
            keel.events(session, limit=0)
        keel.interrupt(session)

    with Keel(server.url, token="wrong-token") as stranger:
        with pytest.raises(Unauthorized) as refused:
            stranger.sessions.list()
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    with Keel(server.url) as anonymous, pytest.raises(Unauthorized):
        anonymous.sessions.get("busy")


def test_error_codes_are_typed_errors_async(server: KeelServer) -> None:
    async def flow() -> None:
        async with AsyncKeel(server.url, token=TOKEN) as keel:
            with pytest.raises(NotFound):
                await keel.submit("no-such-session", "hello")
            spec = server.script("abusy.jsonl", [{"chunks": ["slow "] * 40, "delay_ms": 100}] * 2)
            session = (await keel.sessions.create(model=spec)).id
            await keel.submit(session, "slow")
            with pytest.raises(SessionBusy):
                await keel.submit(session, "now", on_busy="reject")
            await keel.submit(session, "x", idempotency_key="k")
            with pytest.raises(IdempotencyKeyReused):
                await keel.submit(session, "y", idempotency_key="k")
        async with AsyncKeel(server.url, token="nope") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.usage()

    asyncio.run(flow())


def test_an_unknown_code_is_the_base_error() -> None:
    error = error_for(418, "teapot", "short and stout")
    assert type(error) is KeelError
    assert (error.status, error.code, error.message) == (418, "teapot", "short and stout")
