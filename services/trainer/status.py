"""Optional `GET /status` while training: a small FastAPI app served by uvicorn in a background thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from shared.contracts import HealthResponse, TrainerStatus

VERSION = "0.1.0"


def create_app(current_status: Callable[[], TrainerStatus]) -> FastAPI:
    app = FastAPI(title="kernel-agent trainer", version=VERSION)

    @app.get("/status", response_model=TrainerStatus)
    def status() -> TrainerStatus:
        return current_status()

    @app.get("/health", response_model=HealthResponse)
    def health() -> HealthResponse:
        return HealthResponse(service="trainer", version=VERSION, details={"state": current_status().state})

    return app


class StatusServer:
    """Serves the app on 127.0.0.1:port (loopback only: the status carries no secrets but needs no exposure)."""

    def __init__(self, current_status: Callable[[], TrainerStatus], port: int) -> None:
        config = uvicorn.Config(create_app(current_status), host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="trainer-status", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
