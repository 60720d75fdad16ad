"""Typed dependencies of the routes; tests replace them through `app.dependency_overrides`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.implementer.backends import ImplementerBackend
from services.implementer.config import Settings
from services.implementer.metrics import ImplementerMetrics
from shared.serving import check_bearer

_bearer = HTTPBearer(auto_error=False)


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_backend(request: Request) -> ImplementerBackend:
    return request.app.state.backend


def get_metrics(request: Request) -> ImplementerMetrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
BackendDep = Annotated[ImplementerBackend, Depends(get_backend)]
MetricsDep = Annotated[ImplementerMetrics, Depends(get_metrics)]


def require_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Router-level check: when IMPLEMENTER_TOKEN is set, every protected route needs `Authorization: Bearer <token>`."""
    check_bearer(settings.token, credentials)
