"""Pool pieces that need no server: evaluation slots and the resident-memory watchdog."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from services.evaluator.config import Settings
from services.evaluator.pool import QueueFullError, WorkerPool, _watch_memory

# Touches every page, so the memory is resident, then waits to be killed.
HOG = "import time\nblock = bytearray(300 << 20)\nfor i in range(0, len(block), 4096):\n    block[i] = 1\ntime.sleep(60)\n"


def test_memory_watchdog_kills_a_job_over_its_limit() -> None:
    async def run() -> tuple[SimpleNamespace, int]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", HOG, start_new_session=True)
        job = SimpleNamespace(proc=proc, uid=None, signaller=None, killed_for=None)
        await asyncio.wait_for(_watch_memory(job, limit_mb=100, period_s=0.1), 30)  # type: ignore[arg-type]
        return job, await asyncio.wait_for(proc.wait(), 10)

    job, returncode = asyncio.run(run())
    assert job.killed_for == "using more than 100 MB of resident memory" and returncode < 0


def test_memory_watchdog_leaves_a_small_job_alone() -> None:
    async def run() -> SimpleNamespace:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(1)")
        job = SimpleNamespace(proc=proc, uid=None, signaller=None, killed_for=None)
        await asyncio.wait_for(_watch_memory(job, limit_mb=1000, period_s=0.1), 30)  # type: ignore[arg-type]
        return job

    job = asyncio.run(run())
    assert job.killed_for is None and job.proc.returncode == 0


def test_slots_bound_running_and_queued_evaluations(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", work_dir=tmp_path, workers=1, max_queued=1, prespawn=False)

    async def run() -> None:
        pool = WorkerPool(settings, strict=False)
        order: list[str] = []

        async def second() -> None:
            async with pool.slot():
                order.append("second")

        async with pool.slot():
            waiter = asyncio.create_task(second())
            await asyncio.sleep(0.05)
            assert pool.running == 1 and pool.waiting == 1 and order == []
            with pytest.raises(QueueFullError):
                async with pool.slot():
                    pass
            order.append("first")
        await waiter
        assert order == ["first", "second"] and pool.running == 0 and pool.waiting == 0
        await pool.close()
        assert not pool.work_dir.exists()

    asyncio.run(run())


def test_work_dirs_of_dead_evaluators_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / "kernel-agent-evaluator-999999999-abcd"
    alive = tmp_path / f"kernel-agent-evaluator-{os.getpid()}-abcd"
    for path in (dead, alive):
        (path / "w0").mkdir(parents=True)

    async def run() -> None:
        pool = WorkerPool(Settings(cache_dir=tmp_path / "cache", work_dir=tmp_path, prespawn=False), strict=False)
        assert not dead.exists() and alive.exists() and pool.work_dir.exists()
        await pool.close()

    asyncio.run(run())
