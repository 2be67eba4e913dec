"""A submission whose answer was lost is retried with the same key and
queued once; a request that is not safe to send again is not."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from conftest import TOKEN, KeelServer

from keel_client import AsyncKeel, ConnectionFailed, Keel, events


def queued(keel: Keel, session: str) -> list[events.SubmissionQueued]:
    page = keel.events(session, after=0, limit=1000)
    return [e.msg for e in page.events if isinstance(e.msg, events.SubmissionQueued)]


def test_a_retried_submission_after_a_dropped_answer_queues_once(server: KeelServer, proxy_to) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_to(drop=lambda connection: connection == 0)
    with Keel(server.url, token=TOKEN) as direct, Keel(proxy.url, token=TOKEN) as keel:
        session = direct.sessions.create("retry").id
        accepted = keel.submit(session, "only once")
        assert proxy.dropped == 1, "the first answer was lost on the way"
        assert accepted.duplicate, "the retry found the stored submission"
        turn = direct.wait_for_turn(session, accepted, timeout=30)
        assert turn.completed
        stored = queued(direct, session)
        assert len(stored) == 1 and stored[0].op.text == "only once"
        assert stored[0].idempotency_key is not None


def test_a_retried_submission_queues_once_async(server: KeelServer, proxy_to) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_to(drop=lambda connection: connection == 0)

    async def submit() -> None:
        async with AsyncKeel(proxy.url, token=TOKEN) as keel:
            accepted = await keel.submit("retry-async", "only once, async")
            assert accepted.duplicate

    with Keel(server.url, token=TOKEN) as direct:
        direct.sessions.create("retry-async")
        asyncio.run(submit())
        assert proxy.dropped == 1
        assert len(queued(direct, "retry-async")) == 1


def test_a_create_whose_answer_was_lost_is_not_sent_again(server: KeelServer, proxy_to) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_to(drop=lambda connection: connection == 0)
    with Keel(proxy.url, token=TOKEN) as keel, pytest.raises(ConnectionFailed) as lost:
        keel.sessions.create("made-once")
    assert lost.value.status is None and lost.value.code == "connection_failed"
    with Keel(server.url, token=TOKEN) as direct:
        assert [s.id for s in direct.sessions.list().sessions] == ["made-once"]


def test_a_server_that_is_down_fails_after_the_retries(server: KeelServer) -> None:
    server.stop()
    with Keel(server.url, token=TOKEN) as keel, pytest.raises(ConnectionFailed):
        keel.submit("anything", "hello")


def test_a_503_is_retried_with_the_same_key_after_its_retry_after(server: KeelServer, proxy_to) -> None:  # type: ignore[no-untyped-def]
    answers = {"rewritten": 0}

    def first_answer_unavailable(data: bytes) -> bytes:
        # The server stored the submission; the client is told 503 (and to
        # come back in a second), as a gateway might answer.
        if answers["rewritten"] == 0 and data.startswith(b"HTTP/1.1 202 Accepted"):
            answers["rewritten"] += 1
            data = data.replace(b"HTTP/1.1 202", b"HTTP/1.1 503", 1)
            data = re.sub(rb"date: [^\r]*", lambda m: b"retry-after: 1".ljust(len(m.group(0))), data, count=1)
        return data

    proxy = proxy_to(rewrite=first_answer_unavailable)
    with Keel(server.url, token=TOKEN) as direct, Keel(proxy.url, token=TOKEN) as keel:
        session = direct.sessions.create("unavailable").id
        began = time.monotonic()
        accepted = keel.submit(session, "once, after a 503")
        assert answers["rewritten"] == 1
        assert time.monotonic() - began >= 0.9, "the client waited as Retry-After said"
        assert accepted.duplicate, "the retry carried the same key"
        assert len(queued(direct, session)) == 1
