"""Pool pieces that need no server: evaluation slots and the resident-memory watchdog."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from services.evaluator import pool as pool_module
from services.evaluator import sandbox
from services.evaluator.config import Settings
from services.evaluator.pool import MemoryWatch, QueueFullError, Worker, WorkerPool

# Touches every page, so the memory is resident, then waits to be killed.
HOG = "import time\nblock = bytearray(300 << 20)\nfor i in range(0, len(block), 4096):\n    block[i] = 1\ntime.sleep(60)\n"


class WatchedJob:
    """What the memory watch reads of a worker (hashable: the watch keeps a set)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc, self.uid, self.signaller, self.killed_for, self.cgroup = proc, None, None, None, None
        self.disk_device = None  # no disk of its own: its files are not counted

    note_out_of_memory = Worker.note_out_of_memory  # no cgroup: never


def test_one_memory_watch_kills_the_job_over_its_limit_and_leaves_the_others() -> None:
    async def run() -> tuple[WatchedJob, WatchedJob, int]:
        watch = MemoryWatch(limit_mb=100, period_s=0.1)
        hog_proc = await asyncio.create_subprocess_exec(sys.executable, "-c", HOG, start_new_session=True)
        small_proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
        hog, small = WatchedJob(hog_proc), WatchedJob(small_proc)
        watch.watch(small)  # type: ignore[arg-type]
        watch.watch(hog)  # type: ignore[arg-type]
        returncode = await asyncio.wait_for(hog_proc.wait(), 30)
        await asyncio.sleep(0.5)  # more periods: the small job stays
        assert small_proc.returncode is None and hog not in watch.workers and small in watch.workers
        watch.forget(small)  # type: ignore[arg-type]
        small_proc.kill()
        await small_proc.wait()
        await asyncio.sleep(0.3)
        assert watch.task is None, "the watch stops once it watches nothing"
        return hog, small, returncode

    hog, small, returncode = asyncio.run(run())
    assert hog.killed_for == "using more than 100 MB of resident memory" and returncode < 0
    assert small.killed_for is None


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


def test_the_memory_watch_goes_on_after_a_failed_period(monkeypatch: pytest.MonkeyPatch) -> None:
    real_table, calls = sandbox.process_table, []

    def failing_once() -> dict[int, tuple[int, set[int]]]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("a failed read of /proc")
        return real_table()

    monkeypatch.setattr(sandbox, "process_table", failing_once)

    async def run() -> tuple[WatchedJob, int]:
        watch = MemoryWatch(limit_mb=100, period_s=0.1)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", HOG, start_new_session=True)
        hog = WatchedJob(proc)
        watch.watch(hog)  # type: ignore[arg-type]
        return hog, await asyncio.wait_for(proc.wait(), 30)

    hog, returncode = asyncio.run(run())
    assert len(calls) > 1 and hog.killed_for is not None and returncode < 0


def test_a_long_event_line_is_parsed_off_the_event_loop() -> None:
    """A red-team job wrote one line of 16 MiB (millions of empty lists) to its event pipe: parsed and walked on the
    event loop, it held the service for 6 s (/health answered in 13.5 s). In a thread, the loop runs meanwhile but
    for json.loads's own share. Measured against the same parse done inline, so a loaded machine slows both."""
    line = b"[" + b"[]," * (2 << 20) + b"[]]\n"
    started = time.perf_counter()
    assert pool_module._parse_event(line) is not pool_module.FLOODED
    inline_s = time.perf_counter() - started

    async def run() -> float:
        reader = asyncio.StreamReader(limit=pool_module.MAX_EVENT_BYTES)
        reader.feed_data(line + b'{"event": "ready"}\n')
        reader.feed_eof()
        worker = Worker(proc=None, device="cpu", root=Path("."), home=Path("."), uid=None)  # type: ignore[arg-type]
        longest, last = 0.0, time.perf_counter()
        reading = asyncio.create_task(pool_module._read_events(worker, reader))
        while not reading.done():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        assert [event["event"] for event in worker.events] == ["ready"], worker.events
        return longest

    longest = asyncio.run(run())
    assert longest < 0.7 * inline_s, (longest, inline_s)
