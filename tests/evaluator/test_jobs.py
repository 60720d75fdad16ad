"""The bounded in-memory job store behind POST /evaluations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from services.evaluator.jobs import JobStore, JobStoreFullError
from shared.contracts import EvaluateRequest, EvaluationResult, EvaluationStatus

REQUEST = EvaluateRequest(reference_source="x", candidate_source="y")


async def finish(request: EvaluateRequest, on_start: Callable[[], None]) -> EvaluationResult:
    on_start()
    await asyncio.sleep(0)
    return EvaluationResult(status=EvaluationStatus.correct, compiled=True, correct=True)


async def fail(request: EvaluateRequest, on_start: Callable[[], None]) -> EvaluationResult:
    raise RuntimeError("boom")


def test_jobs_finish_and_finished_ones_are_evicted_first() -> None:
    async def run() -> None:
        store = JobStore(max_jobs=2)
        first = store.submit(REQUEST, finish)
        assert first.state == "queued"
        broken = store.submit(REQUEST, fail)
        await asyncio.sleep(0.05)
        assert store.get(first.id).state == "done" and store.get(first.id).result.correct
        assert store.get(broken.id).state == "failed" and "boom" in store.get(broken.id).error
        third = store.submit(REQUEST, finish)
        assert store.get(first.id) is None and store.get(third.id) is not None

    asyncio.run(run())


def test_full_store_of_unfinished_jobs_refuses() -> None:
    async def run() -> None:
        gate = asyncio.Event()

        async def wait(request: EvaluateRequest, on_start: Callable[[], None]) -> EvaluationResult:
            await gate.wait()
            return await finish(request, on_start)

        store = JobStore(max_jobs=1)
        store.submit(REQUEST, wait)
        with pytest.raises(JobStoreFullError):
            store.submit(REQUEST, wait)
        gate.set()
        await store.close()

    asyncio.run(run())
