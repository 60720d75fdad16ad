"""FastAPI application factory of the evaluator service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse

from services.evaluator import held_memory, landlock, routes
from services.evaluator.backends import resolve_device
from services.evaluator.config import Settings, service_version
from services.evaluator.deps import require_token
from services.evaluator.evaluation import Evaluator
from services.evaluator.jobs import JobStore
from services.evaluator.metrics import Metrics
from services.evaluator.pool import WorkerPool
from services.evaluator.sandbox import strict_isolation_works
from shared.contracts import MAX_BATCH_SIZE, MAX_SOURCE_BYTES
from shared.serving import validation_error

log = logging.getLogger(__name__)

# Two sources per request, with room for JSON escaping and the other fields.
MAX_REQUEST_BYTES = 4 * MAX_SOURCE_BYTES + 64 * 1024
MAX_BATCH_BYTES = MAX_BATCH_SIZE * MAX_REQUEST_BYTES

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class BodyLimitMiddleware:
    """Answer 413 before parsing when a body is over its route's limit (Content-Length or streamed bytes)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
    ) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        limit = MAX_BATCH_BYTES if scope["path"].rstrip("/").endswith("/batch") else MAX_REQUEST_BYTES
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        too_big = declared.isdigit() and int(declared) > limit
        body = bytearray()
        more = not too_big
        while more and not too_big:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            too_big = len(body) > limit
        if too_big:
            reply = JSONResponse(
                {"detail": f"request body over {limit} bytes; each source may be at most {MAX_SOURCE_BYTES} bytes"},
                status_code=413,
            )
            await reply(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        strict_works = await asyncio.to_thread(strict_isolation_works, settings.sandbox_uid_base)
        if settings.isolation == "strict" and not strict_works:
            raise RuntimeError(
                "EVALUATOR_ISOLATION=strict does not work here (the log above says why): it needs root with the "
                "capabilities SYS_ADMIN, SETUID, SETGID, CHOWN, DAC_OVERRIDE, FOWNER, KILL and SYS_NICE and "
                "permission to mount (docs/docker.md); grant them or set EVALUATOR_ISOLATION=process"
            )
        strict = settings.isolation != "process" and strict_works
        if not strict and os.geteuid() == 0:
            # `process` isolation changes no uid: its candidates would run as root, able to read the service's
            # environment and signal any process on the host.
            raise RuntimeError(
                "process isolation would run candidates as root: run the service as an unprivileged user for "
                "`process`, or give it what `strict` needs (docs/evaluator.md, Isolation)"
            )
        # The judge holds a checked CPU output to what its timed call left in the worker's memory, which it reads
        # itself (held_memory): where it cannot, timed CPU evaluations end evaluator_error (GPU ones do not read it).
        job_uid = settings.sandbox_uid_base if strict else None
        unreadable = await asyncio.to_thread(held_memory.memory_unreadable_reason, job_uid)
        if unreadable:
            log.warning(
                "this service cannot read its workers' memory (%s): timed evaluations on the CPU will end "
                "evaluator_error; %s (docs/evaluator.md)",
                unreadable,
                "strict isolation needs CAP_SYS_PTRACE for it" if strict else "the kernel's Yama setting forbids it",
            )
        if not strict:
            reach = (
                "read the other evaluations' files and change their modes (Landlock keeps it from their processes "
                "and from writing them)"
                if landlock.abi() >= landlock.SCOPES_ABI
                else "signal, stop or break the other evaluations' workers (no Landlock scopes here: Linux 6.12 has them)"
            )
            log.warning(
                "process isolation: every job runs under this service's uid and can %s; do not train a policy "
                "against this service (docs/evaluator.md, Isolation)",
                reach,
            )
        pool = WorkerPool(settings, strict=strict, memory_readable=not unreadable)
        app.state.evaluator = Evaluator(settings, pool, metrics)
        app.state.jobs = JobStore(settings.max_jobs_stored)
        metrics.queue_depth.set_function(lambda: pool.waiting)
        metrics.running.set_function(lambda: pool.running)
        log.info(
            "evaluator: isolation=%s landlock_abi=%d workers=%d cache=%s",
            "strict" if strict else "process",
            landlock.abi(),
            settings.workers,
            settings.cache_dir,
        )
        await pool.prespawn(resolve_device("auto"))
        try:
            yield
        finally:
            await app.state.jobs.close()
            await pool.close()

    protect_docs = settings.token_value is not None
    app = FastAPI(
        title="kernel-agent evaluator",
        version=service_version(),
        lifespan=lifespan,
        description="Sandboxed scoring of KernelBench-format candidate kernels.",
        docs_url=None if protect_docs else "/docs",
        openapi_url=None if protect_docs else "/openapi.json",
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(BodyLimitMiddleware)

    @app.middleware("http")
    async def count_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        metrics.requests.labels(route=getattr(route, "path", "unmatched"), code=str(response.status_code)).inc()
        return response

    app.add_exception_handler(RequestValidationError, validation_error)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal error; see the evaluator's log"}, status_code=500)

    app.include_router(routes.health)
    app.include_router(routes.api, dependencies=[Depends(require_token)])
    if protect_docs:
        _add_protected_docs(app)
    return app


def _add_protected_docs(app: FastAPI) -> None:
    """With a token set, /openapi.json and /docs sit behind the same bearer check as the API."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(require_token)])
    async def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} docs")
