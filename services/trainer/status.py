"""Optional `GET /status` while training: a small FastAPI app served by uvicorn in a background thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from services.trainer.config import ConfigError
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
        self.thread = threading.Thread(target=self._serve, name="trainer-status", daemon=True)

    def _serve(self) -> None:
        # uvicorn logs why it could not start and exits; start() reports that, so the thread ends quietly.
        with contextlib.suppress(SystemExit):
            self.server.run()

    def start(self) -> None:
        """Returns once the port answers, so that `/status` covers the first update too; a port that cannot be bound
        (uvicorn logs why and its thread ends) is an error here rather than a silently missing status."""
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                port = self.server.config.port
                raise ConfigError(
                    f"status_port {port}: nothing can listen on 127.0.0.1:{port} (in use?); fix: another port"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
