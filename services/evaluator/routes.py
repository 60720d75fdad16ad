"""HTTP routes: validate, call the Evaluator, return a contract model."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Response, status
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.evaluator import landlock
from services.evaluator.backends import BACKENDS, get_backend
from services.evaluator.config import service_version
from services.evaluator.deps import EvaluatorDep, JobStoreDep, MetricsDep, SettingsDep, WorkerPoolDep
from services.evaluator.evaluation import InvalidRequestError
from services.evaluator.jobs import JobStoreFullError
from services.evaluator.pool import QueueFullError
from shared.contracts import (
    MAX_SOURCE_BYTES,
    ErrorResponse,
    EvaluateBatchRequest,
    EvaluateBatchResponse,
    EvaluateRequest,
    EvaluationJob,
    EvaluationResult,
    HealthResponse,
)

T = TypeVar("T")
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 413, 422, 503)}

api = APIRouter(responses=ERRORS)
health = APIRouter()


def check_sources(request: EvaluateRequest, where: str = "") -> None:
    """413 for a source over MAX_SOURCE_BYTES, 400 for one that is not UTF-8 text (lone surrogates)."""
    for field in ("reference_source", "candidate_source"):
        try:
            size = len(getattr(request, field).encode("utf-8"))
        except UnicodeEncodeError:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, f"{where}{field} is not valid UTF-8 text") from None
        if size > MAX_SOURCE_BYTES:
            raise HTTPException(
                413,
                f"{where}{field} is {size} bytes; the limit is {MAX_SOURCE_BYTES}",
            )


async def _answer(call: Awaitable[T]) -> T:
    try:
        return await call
    except InvalidRequestError as exc:
        raise HTTPException(422, str(exc)) from None
    except (QueueFullError, JobStoreFullError) as exc:
        raise HTTPException(503, f"evaluator busy: {exc}", headers={"Retry-After": "10"}) from None


@api.post("/evaluate", response_model=EvaluationResult, summary="Score one candidate against its reference")
async def evaluate(body: EvaluateRequest, evaluator: EvaluatorDep) -> EvaluationResult:
    check_sources(body)
    return await _answer(evaluator.evaluate(body))


@api.post("/evaluate/batch", response_model=EvaluateBatchResponse, summary="Score several candidates concurrently")
async def evaluate_batch(body: EvaluateBatchRequest, evaluator: EvaluatorDep) -> EvaluateBatchResponse:
    for index, item in enumerate(body.items):
        check_sources(item, f"items[{index}].")
        try:
            evaluator.validate(item)
        except InvalidRequestError as exc:
            raise HTTPException(422, f"items[{index}]: {exc}") from None
    results = await _answer(asyncio.gather(*(evaluator.evaluate(item) for item in body.items)))
    return EvaluateBatchResponse(results=list(results))


@api.post(
    "/evaluations",
    response_model=EvaluationJob,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Queue an evaluation; poll GET /evaluations/{id}",
)
async def submit_evaluation(body: EvaluateRequest, evaluator: EvaluatorDep, jobs: JobStoreDep) -> EvaluationJob:
    check_sources(body)
    try:
        evaluator.validate(body)
        return jobs.submit(body, evaluator.evaluate)
    except InvalidRequestError as exc:
        raise HTTPException(422, str(exc)) from None
    except JobStoreFullError as exc:
        raise HTTPException(503, f"evaluator busy: {exc}") from None


@api.get("/evaluations/{job_id}", response_model=EvaluationJob, summary="State and result of a queued evaluation")
async def get_evaluation(job_id: str, jobs: JobStoreDep) -> EvaluationJob:
    job = jobs.get(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no evaluation {job_id!r} (unknown or evicted)")
    return job


@api.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(registry: MetricsDep) -> Response:
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE_LATEST)


@health.get("/health", response_model=HealthResponse, summary="Liveness and isolation level (no auth)")
async def get_health(settings: SettingsDep, pool: WorkerPoolDep) -> HealthResponse:
    return HealthResponse(
        service="evaluator",
        version=service_version(),
        details={
            "isolation": "strict" if pool.strict else "process",
            # "v1" or "v2" where each job has a cgroup (its memory limit and CPU clock by the kernel), else null.
            "job_cgroups": None if pool.cgroups is None else ("v2" if pool.cgroups.v2 else "v1"),
            # MiB of each strict worker's own disk (EVALUATOR_JOB_DISK_MB), null where job files share one.
            "job_disk_mb": pool.job_disk_mb,
            # The Landlock ABI each worker's domain has (landlock.py): 6 and up scope signals too; 0, none.
            "landlock_abi": landlock.abi(),
            "devices": [name for name in BACKENDS if get_backend(name).available()],
            "workers": settings.workers,
            "running": pool.running,
            "queue_depth": pool.waiting,
            # Per GPU: what evaluations may reserve (null until a worker reported the GPU's size), hold and wait for.
            "device_memory_mb": {
                gpu: {
                    "capacity": None if memory.capacity is None else memory.capacity >> 20,
                    "reserved": memory.reserved >> 20,
                    "exclusive": memory.exclusive,
                    "waiting": memory.waiting,
                }
                for gpu, memory in pool.device_memory.items()
                if get_backend("cuda").available()
            },
        },
    )
