"""HTTP routes: validate, call the backend, return a schema."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Response

from services.implementer.deps import BackendDep, MetricsDep, require_token
from shared.contracts import MAX_SOURCE_BYTES, HealthResponse, ImplementRequest, ImplementResponse

VERSION = "0.1.0"

public = APIRouter()
protected = APIRouter(dependencies=[Depends(require_token)])


@public.get("/health", response_model=HealthResponse)
def health(backend: BackendDep) -> HealthResponse:
    return HealthResponse(service="implementer", version=VERSION, details=backend.describe())


@protected.post(
    "/implement",
    response_model=ImplementResponse,
    responses={413: {"description": "a source is larger than MAX_SOURCE_BYTES"}},
)
async def implement(request: ImplementRequest, backend: BackendDep, metrics: MetricsDep) -> ImplementResponse:
    for field in ("reference_source", "current_source"):
        size = len(getattr(request, field).encode())
        if size > MAX_SOURCE_BYTES:
            raise HTTPException(413, f"{field} is {size} bytes; the limit is {MAX_SOURCE_BYTES}")
    response = await backend.implement(request)
    metrics.observe(response)
    return response


@protected.get("/metrics")
def metrics_page(metrics: MetricsDep) -> Response:
    return Response(metrics.render(), media_type="text/plain; version=0.0.4")
