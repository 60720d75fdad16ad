"""`make train` (scripts/train_local.py) for real: services up, one GRPO update, outputs written, nothing left over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_local.py"
# The offline default config, shrunk so that one update takes well under a minute on 2 cores.
TINY = [
    "problems_per_step=1",
    "num_trajectories=2",
    "max_steps_per_episode=1",
    "max_new_tokens=16",
    "timing_trials=3",
    "warmup_trials=1",
    "correctness_trials=1",
    "ppo_epochs=1",
    "mini_batch_size=2",
    "gradient_accumulation_steps=1",
]


class DescendantWatch:
    """Record every process below `pid` (sampled every 0.1 s) so the test can check that none outlives the run."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[tuple[int, float], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                try:
                    key, cmdline = (child.pid, child.create_time()), " ".join(child.cmdline())[:200]
                except psutil.Error:
                    continue
                # Renamed while non-empty: a child seen between fork and exec has its parent's command line, and
                # an exited one (a zombie) has none.
                with self._lock:
                    if cmdline or key not in self.seen:
                        self.seen[key] = cmdline
            time.sleep(0.1)

    def names(self) -> str:
        with self._lock:
            return "\n".join(self.seen.values())

    def survivors(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        left = []
        for (pid, created), cmdline in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid}: {cmdline}")
            except psutil.Error:
                continue
        return left


def start_script(out_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], DescendantWatch]:
    cmd = [sys.executable, str(SCRIPT), "--config", "configs/default.yaml", "--output-dir", str(out_dir), *extra]
    for item in TINY:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As from a terminal: a shell's background job (a CI runner's, say) inherits SIGINT ignored, and so would we.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, DescendantWatch(proc.pid)


def read_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """Read the script's output until a line contains `marker`; keep draining in the background afterwards."""
    assert proc.stdout is not None
    seen: list[str] = []
    found = threading.Event()

    def drain() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if marker in line:
                found.set()

    threading.Thread(target=drain, daemon=True).start()
    if not found.wait(timeout_s):
        proc.kill()
        pytest.fail(f"no {marker!r} within {timeout_s} s; output:\n{''.join(seen)[-3000:]}")
    return "".join(seen)


def test_one_update_writes_outputs_and_stops_services(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, watch = start_script(run_dir, "--updates", "1")
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-4000:]
    assert watch.survivors() == []
    # The services and the trainer really ran as children of the script.
    assert "services.evaluator" in watch.names() and "services.implementer" in watch.names()
    assert "services.trainer" in watch.names()

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == 1
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines() if line.strip()]
    assert len(episodes) == 2  # 1 problem x 2 trajectories x 1 turn
    assert (run_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((run_dir / "final").iterdir())
    assert list(run_dir.rglob("events.out.tfevents.*"))
    for name in ("evaluator", "implementer"):
        assert "/health" in (run_dir / "logs" / f"{name}.log").read_text(), f"{name} log has no health check"
    # The closing report names every output, and none is marked missing.
    for path in ("final", "metrics.jsonl", "reward_curve.png", "logs"):
        assert str(run_dir / path) in output
    assert "(not written)" not in output


def test_ctrl_c_during_training_leaves_no_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, watch = start_script(run_dir, "--updates", "50")
    read_until(proc, "trainer:", timeout_s=300)
    # Interrupt mid-update: once the trainer's first rollout has reached the implementer.
    implementer_log = run_dir / "logs" / "implementer.log"
    deadline = time.monotonic() + 600
    while "POST /implement" not in implementer_log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, "the trainer never reached the implementer"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=240) == 130
    assert watch.survivors() == []
    assert "services.trainer" in watch.names()
    # Whatever the trainer wrote on its way out is complete: no checkpoint is left half-written (they are written
    # to a hidden temp folder, then renamed).
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists():
        assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]
        assert all((p / "state.json").exists() for p in checkpoints.iterdir())


def test_ctrl_c_while_services_start_leaves_no_process(tmp_path: Path) -> None:
    proc, watch = start_script(tmp_path / "run", "--updates", "1")
    deadline = time.monotonic() + 60
    while "services.implementer" not in watch.names() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    # The services get 15 s together to stop before they are killed; the rest is slack for a loaded CI machine.
    assert proc.wait(timeout=120) == 130
    assert watch.survivors() == []


def test_trainer_failure_stops_services(tmp_path: Path) -> None:
    """A config the trainer refuses: the script exits non-zero, says where the logs are, and stops the services."""
    proc, watch = start_script(tmp_path / "run", "--updates", "1", "--set", "gamma=7")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode not in (0, 130), output[-3000:]
    assert "gamma" in output
    assert "service logs are in" in output
    assert watch.survivors() == []


def test_signals_ignored_on_purpose_stay_ignored() -> None:
    """`nohup make train &` must survive the hang-up: an inherited SIG_IGN is kept, the other stop signals caught."""
    sys.path.insert(0, str(SCRIPT.parent))
    import train_local

    saved = {sig: signal.getsignal(sig) for sig in train_local.STOP_SIGNALS}
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        replaced = train_local.catch_stop_signals(signal.default_int_handler)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
        assert set(replaced) == {signal.SIGINT, signal.SIGTERM}
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        sys.path.remove(str(SCRIPT.parent))
