"""Replica choice: least outstanding requests first; a replica that stops answering is skipped."""

from __future__ import annotations

import asyncio

import pytest

from services.trainer.replicas import ReplicaPool
from shared.clients import AsyncEvaluatorClient, ServiceError
from tests.servers import free_port


class SlowClient:
    def __init__(self, url: str) -> None:
        self.url, self.calls = url, 0

    async def work(self, seconds: float) -> str:
        self.calls += 1
        await asyncio.sleep(seconds)
        return self.url


def test_least_outstanding_spreads_concurrent_requests():
    pool = ReplicaPool(["a", "b", "c"], SlowClient)

    async def run() -> list[str]:
        return await asyncio.gather(*(pool.call(lambda c: c.work(0.05)) for _ in range(6)))

    served = asyncio.run(run())
    assert sorted(served) == ["a", "a", "b", "b", "c", "c"]


def test_busy_replica_is_avoided():
    pool = ReplicaPool(["a", "b"], SlowClient)

    async def run() -> list[str]:
        slow = asyncio.create_task(pool.call(lambda c: c.work(0.3)))  # occupies "a"
        await asyncio.sleep(0.01)
        quick = [await pool.call(lambda c: c.work(0.0)) for _ in range(3)]
        await slow
        return quick

    assert asyncio.run(run()) == ["b", "b", "b"]


def test_dead_replica_is_skipped_then_retried_after_cooldown():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused

    class Live:
        async def health(self) -> str:
            return "live"

    clients = {dead: AsyncEvaluatorClient(dead, retries=0, timeout_s=2.0), "live": Live()}
    pool = ReplicaPool([dead, "live"], clients.__getitem__, cooldown_s=60.0)

    async def run() -> list[str]:
        return [await pool.call(lambda c: c.health()) for _ in range(3)]

    assert asyncio.run(run()) == ["live", "live", "live"]
    dead_replica = pool.replicas[0]
    assert dead_replica.failures == 1 and dead_replica.requests == 1  # tried once, then skipped
    dead_replica.dead_until = 0.0
    assert pool.pick() is dead_replica


def test_all_dead_raises_service_error_and_http_errors_pass_through():
    url = f"http://127.0.0.1:{free_port()}"
    pool = ReplicaPool([url], lambda u: AsyncEvaluatorClient(u, retries=0, timeout_s=2.0))
    with pytest.raises(ServiceError) as info:
        asyncio.run(pool.call(lambda c: c.health()))
    assert info.value.status_code is None

    class Refusing:
        async def go(self) -> None:
            raise ServiceError("x", 413, "too large")

    pool = ReplicaPool(["x", "y"], lambda u: Refusing())
    with pytest.raises(ServiceError):
        asyncio.run(pool.call(lambda c: c.go()))
    assert [r.requests for r in pool.replicas] == [1, 0]  # an HTTP answer is not a dead replica
