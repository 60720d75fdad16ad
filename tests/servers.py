"""Start a real service (`python -m services.<name>`) on a free 127.0.0.1 port for a test, and stop it by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def python_path(*extra: str) -> str:
    """The repo, then the caller's PYTHONPATH (carried wheels on a machine without pip), then `extra`."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", ""), *extra) if p)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode} before it was healthy")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url}/health did not answer within {timeout_s} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


@contextlib.contextmanager
def run_service(
    name: str, env: dict[str, str] | None = None, log_path: Path | None = None, timeout_s: float = 120.0
) -> Iterator[str]:
    """Yield the base URL of `python -m services.<name>` serving on 127.0.0.1."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": python_path(), **(env or {})}
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", f"services.{name}", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s)
        yield url
    finally:
        stop(proc)
        if log_path:
            log.close()  # type: ignore[union-attr]
