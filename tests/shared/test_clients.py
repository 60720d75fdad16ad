"""The clients' one retry policy: connection errors and 429/502/503/504 are retried a bounded number of times."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from tenacity import wait_none

from shared.clients import base
from shared.clients.base import AsyncServiceClient, ServiceError, SyncServiceClient


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "RETRY_WAIT", wait_none())


def answers(*replies: int | Exception) -> tuple[list[int], httpx.MockTransport]:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        reply = replies[min(len(calls), len(replies) - 1)]
        calls.append(1)
        if isinstance(reply, Exception):
            raise reply
        return httpx.Response(reply, json={"detail": f"status {reply}"} if reply >= 400 else {"ok": True})

    return calls, httpx.MockTransport(handler)


def sync_client(transport: httpx.MockTransport, retries: int = 2) -> SyncServiceClient:
    client = SyncServiceClient("http://svc", retries=retries)
    client._http = httpx.Client(base_url="http://svc", transport=transport)
    return client


def test_retries_then_succeeds():
    calls, transport = answers(503, httpx.ConnectError("refused"), 200)
    assert sync_client(transport).request("GET", "/x") == {"ok": True}
    assert len(calls) == 3


def test_gives_up_after_the_retries_with_the_last_status():
    calls, transport = answers(429)
    with pytest.raises(ServiceError) as info:
        sync_client(transport, retries=1).request("GET", "/x")
    assert (info.value.status_code, len(calls)) == (429, 2)


def test_unreachable_is_a_typed_error():
    calls, transport = answers(httpx.ConnectError("refused"))
    with pytest.raises(ServiceError) as info:
        sync_client(transport, retries=0).request("GET", "/x")
    assert info.value.status_code is None and len(calls) == 1


def test_client_errors_are_not_retried():
    calls, transport = answers(422)
    with pytest.raises(ServiceError, match="status 422"):
        sync_client(transport).request("POST", "/x", json={})
    assert len(calls) == 1


def test_async_client_retries_the_same_way():
    calls, transport = answers(502, 200)

    async def go() -> object:
        client = AsyncServiceClient("http://svc", retries=2)
        client._http = httpx.AsyncClient(base_url="http://svc", transport=transport)
        async with client:
            return await client.request("GET", "/x")

    assert asyncio.run(go()) == {"ok": True}
    assert len(calls) == 2
