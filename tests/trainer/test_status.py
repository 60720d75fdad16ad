"""`GET /status` answers from the moment the server starts (the first update included), and a port that cannot be
bound is a config error, not a run with no status."""

from __future__ import annotations

import socket

import httpx
import pytest

from services.trainer.config import ConfigError
from services.trainer.status import StatusServer
from shared.contracts import TrainerStatus
from tests.servers import free_port


def _status() -> TrainerStatus:
    return TrainerStatus(state="training", update=3, total_updates=5, run_dir="/runs/x", last_metrics={})


def test_the_status_answers_as_soon_as_start_returns():
    server = StatusServer(_status, free_port())
    server.start()
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.server.config.port}/status", timeout=5).json()
        assert answer["update"] == 3 and answer["total_updates"] == 5 and answer["state"] == "training"
    finally:
        server.stop()
    assert not server.thread.is_alive()


def test_a_port_in_use_is_a_config_error_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"status_port {port}"):
            StatusServer(_status, port).start()
