"""Spread requests over several replicas of one service: least outstanding work first, skip one that stops answering."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from shared.clients import ServiceError

log = logging.getLogger(__name__)

ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")


@dataclass
class Replica(Generic[ClientT]):
    url: str
    client: ClientT
    outstanding: int = 0
    dead_until: float = 0.0  # time.monotonic() before which the replica is skipped
    requests: int = 0
    failures: int = 0


class ReplicaPool(Generic[ClientT]):
    """Each call goes to the live replica with the fewest requests in flight (ties: the least used).

    A replica whose request fails with no HTTP answer (connection refused, timeout after the client's own retries)
    is skipped for `cooldown_s` while another one is live, and the call moves on to the next replica; an HTTP
    error status is the request's own answer and is raised as is. When every replica failed, the last
    ServiceError is raised.
    """

    def __init__(self, urls: Sequence[str], make_client: Callable[[str], ClientT], cooldown_s: float = 30.0) -> None:
        if not urls:
            raise ValueError("a replica pool needs at least one URL")
        self.replicas = [Replica(url=url, client=make_client(url)) for url in dict.fromkeys(urls)]
        self.cooldown_s = cooldown_s

    def pick(self, exclude: set[str] | frozenset[str] = frozenset()) -> Replica[ClientT] | None:
        now = time.monotonic()
        untried = [r for r in self.replicas if r.url not in exclude]
        live = [r for r in untried if r.dead_until <= now]
        if live:
            return min(live, key=lambda r: (r.outstanding, r.requests))
        # Every untried replica is cooling down: try the one that failed longest ago, it may be back.
        return min(untried, key=lambda r: r.dead_until, default=None)

    async def call(self, request: Callable[[ClientT], Awaitable[ResultT]]) -> ResultT:
        tried: set[str] = set()
        last_error: ServiceError | None = None
        while (replica := self.pick(tried)) is not None:
            tried.add(replica.url)
            replica.outstanding += 1
            replica.requests += 1
            try:
                return await request(replica.client)
            except ServiceError as exc:
                if exc.status_code is not None:
                    raise
                replica.failures += 1
                replica.dead_until = time.monotonic() + self.cooldown_s
                log.warning(
                    "replica %s stopped answering (%s); skipping it for %.0f s",
                    replica.url,
                    exc.detail,
                    self.cooldown_s,
                )
                last_error = exc
            finally:
                replica.outstanding -= 1
        raise last_error or ServiceError(",".join(r.url for r in self.replicas), None, "every replica is down")

    async def aclose(self) -> None:
        for replica in self.replicas:
            close = getattr(replica.client, "aclose", None)
            if close is not None:
                await close()
