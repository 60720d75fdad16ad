"""Start a real service (`python -m services.<name>`) on a free 127.0.0.1 port for a test, and stop it by PID."""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
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
def as_user(user: str, command: Sequence[str], needed: Sequence[str]) -> Iterator[list[str]]:
    """`command` for root to run as `user`, in a mount namespace of its own in which the `needed` paths (the
    interpreter, the repository) are reachable: a directory others cannot enter above one of them (/root holding a
    pyenv Python) is covered there by an empty one holding only the needed paths, bound back in."""
    from services.evaluator.sandbox import _untraversable_ancestor

    entry = pwd.getpwnam(user)
    covered = {path: _untraversable_ancestor(path) for path in dict.fromkeys(os.path.realpath(p) for p in needed)}
    kept = [path for path, ancestor in covered.items() if ancestor is not None]
    with tempfile.TemporaryDirectory(prefix="ka-as-user-") as stage:
        lines = ["set -e", "mount --make-rprivate /"]
        for index, path in enumerate(kept):
            os.mkdir(f"{stage}/{index}")
            lines.append(f"mount --bind {shlex.quote(path)} {stage}/{index}")
        for ancestor in sorted({covered[path] for path in kept}, key=len):
            lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(ancestor))}")
        for index, path in enumerate(kept):
            lines.append(f"mkdir -p {shlex.quote(path)} && mount --bind {stage}/{index} {shlex.quote(path)}")
        ids = [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
        lines.append(f'exec setpriv {" ".join(ids)} -- "$@"')
        yield ["unshare", "--mount", "bash", "-c", "\n".join(lines), "as_user", *command]


@contextlib.contextmanager
def run_service(
    name: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    timeout_s: float = 120.0,
    user: str | None = None,
    prefix: Sequence[str] = (),
) -> Iterator[str]:
    """Yield the base URL of `python -m services.<name>` serving on 127.0.0.1, behind `prefix` (setpriv taking
    capabilities away); as `user` (see as_user) if given and this process is root."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": python_path(), **(env or {})}
    command = [*prefix, sys.executable, "-m", f"services.{name}", "--host", "127.0.0.1", "--port", str(port)]
    with contextlib.ExitStack() as stack:
        if user is not None and os.geteuid() == 0:
            needed = [str(REPO), sys.prefix, sys.base_prefix, *full_env["PYTHONPATH"].split(os.pathsep)]
            command = stack.enter_context(as_user(user, command, [p for p in needed if p]))
        yield stack.enter_context(_serve(command, full_env, port, log_path, timeout_s))


@contextlib.contextmanager
def _serve(
    command: list[str], full_env: dict[str, str], port: int, log_path: Path | None, timeout_s: float
) -> Iterator[str]:
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        command,
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
