"""Typed FastAPI dependencies; tests replace them through `app.dependency_overrides`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.evaluator.config import Settings
from services.evaluator.evaluation import Evaluator
from services.evaluator.jobs import JobStore
from services.evaluator.metrics import Metrics
from services.evaluator.pool import WorkerPool
from shared.serving import check_bearer


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_evaluator(request: Request) -> Evaluator:
    return request.app.state.evaluator


def get_worker_pool(request: Request) -> WorkerPool:
    return request.app.state.evaluator.pool


def get_jobs(request: Request) -> JobStore:
    return request.app.state.jobs


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
EvaluatorDep = Annotated[Evaluator, Depends(get_evaluator)]
WorkerPoolDep = Annotated[WorkerPool, Depends(get_worker_pool)]
JobStoreDep = Annotated[JobStore, Depends(get_jobs)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]

_bearer = HTTPBearer(auto_error=False)


def require_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Router-level check: with EVALUATOR_TOKEN set, every route but /health needs `Authorization: Bearer`."""
    check_bearer(settings.token_value, credentials)
