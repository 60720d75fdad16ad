"""Large inputs against a small worker memory limit: the candidate worker holds one trial's inputs at a time.

Five trials of 192 MiB inputs come to ~1 GiB; loading them all at once (as the worker once did) pushes a worker past
a 2 GiB address-space limit, one trial at a time stays well inside it. GPU-sized problems depend on the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.evaluator.conftest import evaluate, server_env
from tests.servers import run_service

LARGE_REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.rand(48 * 1024 * 1024)]  # 192 MiB of float32


def get_init_inputs():
    return []
"""

LARGE_CANDIDATE = """
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x
"""


@pytest.fixture(scope="module")
def small_memory_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    cache = tmp_path_factory.mktemp("memory-cache")
    log: Path = tmp_path_factory.mktemp("memory-log") / "server.log"
    env = server_env(cache, EVALUATOR_MEMORY_LIMIT_MB="2048", EVALUATOR_WORKERS="1")
    with run_service("evaluator", env=env, log_path=log) as url, httpx.Client(base_url=url, timeout=600) as http:
        yield http


def test_five_large_trials_fit_a_small_memory_limit(small_memory_client: httpx.Client) -> None:
    result = evaluate(
        small_memory_client,
        LARGE_CANDIDATE,
        LARGE_REFERENCE,
        correctness_trials=5,
        timing_trials=3,
        warmup_trials=1,
        timeout_s=240,
    )
    assert result["status"] == "correct", result["message"]
    assert result["max_abs_error"] == 0.0
