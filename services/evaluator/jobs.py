"""In-memory store of queued evaluations (`POST /evaluations`), bounded: finished jobs are evicted oldest first."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from shared.contracts import EvaluateRequest, EvaluationJob, EvaluationResult

# `run(request, on_start)`: evaluates, calling `on_start()` once a worker slot is free.
Runner = Callable[[EvaluateRequest, Callable[[], None]], Awaitable[EvaluationResult]]

log = logging.getLogger(__name__)


class JobStoreFullError(RuntimeError):
    """Every stored job is still unfinished."""


class JobStore:
    def __init__(self, max_jobs: int) -> None:
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[str, EvaluationJob] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, job_id: str) -> EvaluationJob | None:
        return self._jobs.get(job_id)

    def submit(self, request: EvaluateRequest, run: Runner) -> EvaluationJob:
        """Queue `run(request)` in the background and return the job record."""
        self._evict()
        job = EvaluationJob(id=uuid.uuid4().hex, state="queued", created_at=time.time())
        self._jobs[job.id] = job
        task = asyncio.create_task(self._run(job.id, request, run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job_id: str, request: EvaluateRequest, run: Runner) -> None:
        try:
            result = await run(request, lambda: self._update(job_id, state="running"))
        except Exception as exc:
            log.exception("job %s failed", job_id)
            self._update(job_id, state="failed", finished_at=time.time(), error=f"{type(exc).__name__}: {exc}"[:500])
        else:
            self._update(job_id, state="done", finished_at=time.time(), result=result)

    def _update(self, job_id: str, **changes: object) -> None:
        if job_id in self._jobs:
            self._jobs[job_id] = self._jobs[job_id].model_copy(update=changes)

    def _evict(self) -> None:
        while len(self._jobs) >= self.max_jobs:
            finished = next((jid for jid, job in self._jobs.items() if job.state in ("done", "failed")), None)
            if finished is None:
                raise JobStoreFullError(f"{len(self._jobs)} jobs are still queued or running")
            del self._jobs[finished]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
