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


# Each helper holds its memory in a thread, then ends its main thread alone (the exit syscall, not exit_group): the
# process lives on, but /proc/<pid>/statm, read through the exited main thread, shows no memory at all.
HELPER_HOLDING_MEMORY = """
import ctypes, platform, sys, threading, time
SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]
def hold():
    time.sleep(0.5)  # the main thread has ended by now: the memory never shows through it
    kept = b"k" * (HOLD_MB << 20)  # written: resident
    print("held", flush=True)
    time.sleep(120)
threading.Thread(target=hold).start()
ctypes.CDLL(None).syscall(SYS_EXIT, 0)
"""

HIDDEN_HELPERS_CANDIDATE = f"""
import subprocess, sys, time
import torch.nn as nn

HELPER = {HELPER_HOLDING_MEMORY!r}
helpers = []


class ModelNew(nn.Module):
    def forward(self, x):
        if not helpers:
            for _ in range(2):
                code = "HOLD_MB = 1100" + HELPER
                helpers.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE))
            for helper in helpers:
                helper.stdout.readline()
            time.sleep(3)  # the watch looks twice a second
        return x * 2.0
"""

SMALL_REFERENCE = LARGE_REFERENCE.replace("48 * 1024 * 1024", "1024")


def test_memory_of_helpers_whose_main_thread_exited_counts(small_memory_client: httpx.Client) -> None:
    """Two helpers of 1100 MB each, past the 2048 MB limit together, their main threads gone: the watch reads their
    memory through a thread still running, and the job is killed."""
    result = evaluate(small_memory_client, HIDDEN_HELPERS_CANDIDATE, SMALL_REFERENCE, timeout_s=120)
    assert result["status"] != "correct", result
    assert "resident memory" in result["message"], result["message"]
