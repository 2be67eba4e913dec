"""The client refuses a server of another major API version, or one that
does not say its version (the real server's answers, rewritten on the way)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import TOKEN, KeelServer

from keel_client import API_VERSION, ApiVersionMismatch, AsyncKeel, Keel

HEADER = b"keel-api-version: " + API_VERSION.encode()


def test_the_server_speaks_our_version(server: KeelServer) -> None:
    with Keel(server.url, token=TOKEN) as keel:
        keel.sessions.list()


def test_another_major_version_is_refused(server: KeelServer, proxy_to) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_to(rewrite=lambda data: data.replace(HEADER, b"keel-api-version: 2.0.0"))
    with Keel(proxy.url, token=TOKEN) as keel, pytest.raises(ApiVersionMismatch) as refused:
        keel.sessions.list()
    assert "2.0.0" in refused.value.message and refused.value.code == "api_version_mismatch"


def test_a_missing_version_header_is_refused(server: KeelServer, proxy_to) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_to(rewrite=lambda data: data.replace(HEADER, b"x-other-header:   " + API_VERSION.encode()))

    async def flow() -> None:
        async with AsyncKeel(proxy.url, token=TOKEN) as keel:
            with pytest.raises(ApiVersionMismatch):
                await keel.sessions.create("unversioned")
            with pytest.raises(ApiVersionMismatch):
                async for _ in keel.stream("unversioned"):
                    break

    asyncio.run(flow())
