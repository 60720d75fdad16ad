"""A private Docker engine for the compose test: started as root with its own socket, stopped by PID.

`dockerd --iptables=false --storage-driver=vfs` works inside a VM without kernel overlay support or iptables
rights; images persist in the data root between runs (`KERNEL_AGENT_DOCKER_ROOT`), so only the first run builds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

DATA_ROOT = Path(os.environ.get("KERNEL_AGENT_DOCKER_ROOT", Path.home() / ".cache/kernel-agent/docker/engine"))


@dataclass(frozen=True)
class Engine:
    host: str  # DOCKER_HOST of this engine
    pid: int
    log: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host, **extra}


def missing_tools() -> list[str]:
    missing = [tool for tool in ("dockerd", "docker", "debootstrap") if shutil.which(tool) is None]
    if compose_command() is None:
        missing.append("docker compose / docker-compose")
    return missing


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) where it exists, else `docker-compose` (v1, e.g. Debian's package)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def build_command() -> tuple[list[str], dict[str, str]]:
    """A BuildKit build where the CLI offers one (shared layers, no container per metadata step: much faster on
    vfs), else the classic builder. The Dockerfiles work with both."""
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0:
        return ["docker", "buildx", "build", "--load"], {}
    for cli in (shutil.which("docker"), "/usr/bin/docker"):
        if cli and os.path.exists(cli):
            version = subprocess.run(
                [cli, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True
            ).stdout.strip()
            # Clients before 23.0 carry BuildKit themselves (DOCKER_BUILDKIT=1); later ones need buildx.
            if version and int(version.split(".")[0]) < 23:
                return [cli, "build"], {"DOCKER_BUILDKIT": "1"}
    return ["docker", "build"], {"DOCKER_BUILDKIT": "0"}


@contextlib.contextmanager
def docker_engine() -> Iterator[Engine]:
    run_dir = Path(tempfile.mkdtemp(prefix="ka-dockerd-", dir="/tmp"))  # short: unix socket paths are limited
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    log = run_dir / "dockerd.log"
    host = f"unix://{run_dir}/docker.sock"
    cmd = [
        "dockerd",
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
        "--storage-driver=vfs",
        f"--data-root={DATA_ROOT}",
        f"--exec-root={run_dir}/exec",
        f"--pidfile={run_dir}/docker.pid",
        "-H",
        host,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(host=host, pid=proc.pid, log=log)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=engine.env(), capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield engine
    finally:
        stop_engine(proc)
        shutil.rmtree(run_dir, ignore_errors=True)


def stop_engine(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM dockerd (it stops its containers and containerd); SIGKILL what is left, by PID."""
    children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
