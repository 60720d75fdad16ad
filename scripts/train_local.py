"""`make train`: start the evaluator and implementer on 127.0.0.1, run the trainer against them, stop everything.

The services and the trainer run as subprocesses in process groups of their own, so a Ctrl-C in the terminal reaches
only this script, which forwards it to the trainer (the trainer stops after writing what is consistent) and then
stops the services. Everything a service started is stopped too: its descendants are collected before the stop and
any that outlive their group are killed by PID.

usage: python scripts/train_local.py --config configs/default.yaml [--updates N] [--output-dir DIR [--resume]]
                                     [--set FIELD=VALUE ...] [--implementer-backend builtin|openai]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
HEALTH_TIMEOUT_S = 300.0
# Time the trainer gets after the first Ctrl-C to finish its step and write a consistent checkpoint.
TRAINER_GRACE_S = 120.0
SERVICE_GRACE_S = 15.0


class Interrupted(Exception):
    """A second Ctrl-C / SIGTERM: stop waiting for the trainer."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml", help="trainer YAML config")
    parser.add_argument("--updates", type=int, default=None, help="GRPO updates (default: the config's)")
    parser.add_argument("--output-dir", type=Path, default=None, help="run directory (default: runs/<UTC time>)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="trainer config override, passed on as --FIELD VALUE; repeatable",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --output-dir from its newest checkpoint"
    )
    parser.add_argument(
        "--implementer-backend",
        choices=["builtin", "openai"],
        default=os.environ.get("IMPLEMENTER_BACKEND", "builtin"),
        help="implementer backend (default: $IMPLEMENTER_BACKEND, else builtin: offline)",
    )
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(cmd: list[str], env: dict[str, str], log_path: Path | None) -> subprocess.Popen[bytes]:
    """Start `cmd` in a new session (own process group); output to `log_path`, or inherited when None."""
    out = open(log_path, "wb") if log_path else None  # noqa: SIM115 - the child holds it; closed on exit
    try:
        return subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True
        )
    finally:
        if out:
            out.close()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_healthy(services: dict[str, tuple[subprocess.Popen[bytes], str, Path]]) -> None:
    pending = dict(services)
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while pending:
        for name, (proc, url, log_path) in list(pending.items()):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the {name} exited with code {proc.returncode} before it was healthy; "
                    f"last lines of {log_path}:\n{tail(log_path)}"
                )
            if healthy(url):
                print(f"{name} is up at {url} (log: {log_path})", flush=True)
                del pending[name]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer from /health of {', '.join(pending)} within {HEALTH_TIMEOUT_S:.0f} s")
        time.sleep(0.3)


def tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def stop_groups(procs: list[subprocess.Popen[bytes]], sig: int, grace_s: float) -> None:
    """Send `sig` to every process group at once, give them `grace_s` together, then SIGKILL the groups and the
    stragglers outside them."""
    stragglers = [child for proc in procs for child in descendants(proc.pid)]  # before leaders exit and reparent
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _, alive = psutil.wait_procs(stragglers, timeout=2.0)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=5.0)


def service_env(args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["IMPLEMENTER_BACKEND"] = args.implementer_backend
    return env


def trainer_command(args: argparse.Namespace, run_dir: Path, evaluator_url: str, implementer_url: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "services.trainer",
        "--config",
        str(args.config),
        "--evaluator-url",
        evaluator_url,
        "--implementer-url",
        implementer_url,
        "--output-dir",
        str(run_dir),
    ]
    if args.updates is not None:
        cmd += ["--updates", str(args.updates)]
    if args.resume:
        cmd.append("--resume")
    for item in args.overrides:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise SystemExit(f"--set expects FIELD=VALUE, got {item!r}")
        cmd += [f"--{field.strip()}", value]
    return cmd


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def catch_stop_signals(handler: Callable[[int, FrameType | None], Any]) -> dict[int, Any]:
    """Route the stop signals to `handler`, except those this process inherited as ignored (`nohup` ignores SIGHUP,
    a shell's background job SIGINT): those stay ignored. Returns the handlers replaced."""
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


def run_trainer(cmd: list[str], env: dict[str, str]) -> int:
    """Run the trainer to its end; the first Ctrl-C/SIGTERM asks it to stop, a second one kills it."""
    trainer = start(cmd, env, log_path=None)
    requests: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        requests.append(signum)
        if len(requests) > 1:
            raise Interrupted
        print(f"\n{signal.Signals(signum).name}: asking the trainer to stop (again to force)", flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(trainer.pid, signal.SIGINT)

    previous = catch_stop_signals(on_signal)
    try:
        deadline = None
        while trainer.poll() is None:
            if requests and deadline is None:
                deadline = time.monotonic() + TRAINER_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                print("the trainer did not stop in time; terminating it", flush=True)
                break
            time.sleep(0.2)
    except Interrupted:
        print("stopping now", flush=True)
    finally:
        # Ignore further signals while cleaning up, so that cleanup itself cannot be interrupted half-way.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        stop_groups([trainer], signal.SIGTERM, grace_s=10.0)
    return 130 if requests else trainer.returncode


def report(run_dir: Path) -> None:
    """Say where the outputs are (and which ones the trainer did not write)."""
    print(f"\nrun directory: {run_dir}")
    outputs = {
        "model": run_dir / "final",
        "metrics": run_dir / "metrics.jsonl",
        "episodes": run_dir / "episodes.jsonl",
        "reward curve": run_dir / "reward_curve.png",
        "service logs": run_dir / "logs",
    }
    events = sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")})
    outputs["TensorBoard"] = events[0] if events else run_dir / "tensorboard"
    for label, path in outputs.items():
        print(f"  {label:<13} {path}{'' if path.exists() else '  (not written)'}")
    if events:
        print(f"  view with:    tensorboard --logdir {events[0]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resume and args.output_dir is None:
        raise SystemExit("--resume needs --output-dir: the run directory to continue")
    run_dir = (args.output_dir or REPO / "runs" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")).resolve()
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = service_env(args)
    services: dict[str, tuple[subprocess.Popen[bytes], str, Path]] = {}
    code = 1
    # Until the trainer runs, Ctrl-C / SIGTERM raise KeyboardInterrupt here, and the finally below stops the services.
    catch_stop_signals(signal.default_int_handler)
    try:
        for name in ("evaluator", "implementer"):
            port = free_port()
            cmd = [sys.executable, "-m", f"services.{name}", "--host", "127.0.0.1", "--port", str(port)]
            services[name] = (start(cmd, env, logs / f"{name}.log"), f"http://127.0.0.1:{port}", logs / f"{name}.log")
        wait_healthy(services)
        cmd = trainer_command(args, run_dir, services["evaluator"][1], services["implementer"][1])
        print("trainer:", " ".join(cmd), flush=True)
        code = run_trainer(cmd, env)
    except KeyboardInterrupt:
        print("\ninterrupted before training started", flush=True)
        code = 130
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        stop_groups([proc for proc, _, _ in services.values()], signal.SIGTERM, SERVICE_GRACE_S)
    report(run_dir)
    if code != 0:
        print(f"\ntraining ended with exit code {code}; service logs are in {logs}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
