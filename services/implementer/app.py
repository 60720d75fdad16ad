"""App factory of the implementer service."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from services.implementer.backends import ImplementerBackend, build_backend
from services.implementer.config import Settings
from services.implementer.metrics import ImplementerMetrics
from services.implementer.routes import VERSION, protected, public
from shared.serving import validation_error

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, backend: ImplementerBackend | None = None) -> FastAPI:
    """Build the app; raises ValueError at start-up for a configuration that cannot work."""
    settings = settings or Settings()
    backend = backend or build_backend(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await backend.aclose()

    app = FastAPI(
        title="kernel-agent implementer",
        version=VERSION,
        lifespan=lifespan,
        description="Turns a kernel plus one optimization suggestion into a new KernelBench candidate.",
    )
    app.state.settings = settings
    app.state.backend = backend
    app.state.metrics = ImplementerMetrics()
    app.include_router(public)
    app.include_router(protected)

    app.add_exception_handler(RequestValidationError, validation_error)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse({"detail": "internal error; see the implementer log"}, status_code=500)

    return app
