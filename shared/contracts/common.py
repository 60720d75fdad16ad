"""Contracts every service shares: health and error bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class HealthResponse(BaseModel):
    """Answer of `GET /health`: cheap, unauthenticated, used by compose health checks."""

    status: Literal["ok", "degraded"] = "ok"
    service: str = Field(description="`evaluator`, `implementer` or `trainer`.")
    version: str
    details: dict[str, Any] = Field(
        default_factory=dict, description="Service-specific facts (devices, backend, queue depth)."
    )


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer."""

    detail: str | list[dict[str, Any]] = Field(
        description="Readable reason; validation errors list the offending fields."
    )
