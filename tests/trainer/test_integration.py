"""The real CLI, end to end, against the real evaluator and builtin implementer on 127.0.0.1, with a tiny random
SmolLM2-shaped model: the first run is SIGKILLed once its update-1 checkpoint exists, `--resume` finishes update 2."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import REPO, free_port, run_service

pytestmark = pytest.mark.slow

TINY_RUN = [
    "--config",
    "configs/default.yaml",
    "--model",
    "random:smollm2-tiny",
    "--problems",
    "builtin/elementwise_chain",
    "--problems-per-step",
    "1",
    "--num-trajectories",
    "2",
    "--max-steps-per-episode",
    "2",
    "--max-new-tokens",
    "16",
    "--max-prompt-tokens",
    "1024",
    "--top-p",
    "1.0",
    "--timing-trials",
    "3",
    "--correctness-trials",
    "1",
    "--warmup-trials",
    "1",
    "--mini-batch-size",
    "2",
    "--updates",
    "2",
    "--save-every",
    "1",
]


@pytest.fixture(scope="module")
def services():
    with (
        run_service("evaluator") as evaluator,
        run_service("implementer", env={"IMPLEMENTER_BACKEND": "builtin"}) as implementer,
    ):
        yield ["--evaluator-url", evaluator, "--implementer-url", implementer]


def _trainer(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.trainer", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_two_updates_kill_after_checkpoint_and_resume(services, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "trainer.log"
    port = free_port()
    proc = _trainer([*TINY_RUN, *services, "--output-dir", str(run_dir), "--status-port", str(port)], log)
    checkpoint = run_dir / "checkpoints" / "update-000001" / "state.json"
    statuses = []
    try:
        deadline = time.monotonic() + 600
        while not checkpoint.exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            with contextlib.suppress(httpx.HTTPError):
                statuses.append(httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json())
            time.sleep(0.25)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert statuses and statuses[-1]["total_updates"] == 2 and statuses[-1]["state"] == "training"
    assert not (run_dir / "final").exists()

    resumed = _trainer([*TINY_RUN, *services, "--output-dir", str(run_dir), "--resume"], log)
    assert resumed.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert "at update 1" in log.read_text()

    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["update"] for m in metrics] == [1, 2]  # update 2 logged once even if the killed run got that far
    for m in metrics:
        assert m["samples"] + m["rate/left_out"] * 4 == pytest.approx(4)
        assert -1.0 <= m["reward/mean"] and m["time/generation_s"] > 0
    episodes = _lines(run_dir / "episodes.jsonl")
    assert sorted((e["update"], e["trajectory"], e["turn"]) for e in episodes) == [
        (u, j, t) for u in (1, 2) for j in range(2) for t in range(2)
    ]
    assert all(e["problem_id"] == "builtin/elementwise_chain" for e in episodes)
    assert {e["verdict"] for e in episodes} - {None} <= {
        "correct",
        "incorrect",
        "compile_error",
        "runtime_error",
        "timeout",
        "crashed",
        "rejected",
        "evaluator_error",
    }
    assert (run_dir / "final" / "adapter_config.json").exists()
    assert (run_dir / "checkpoints" / "update-000002" / "optimizer.pt").exists()
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert not list((run_dir / "checkpoints").glob(".update-*"))  # no half-written checkpoint left


def test_bad_config_exits_2_with_the_fix(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.trainer",
            "--config",
            "configs/default.yaml",
            "--gamma",
            "2",
            "--evaluator-url",
            "http://x",
            "--implementer-url",
            "http://y",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "gamma" in out.stderr and "fix" in out.stderr


def test_two_processes_train_one_update_together(services, tmp_path):
    """Data-parallel as on several GPUs (`torchrun`/`accelerate launch`), here with two CPU processes and gloo: each
    process takes one of the update's two problems, both step in lockstep, the main process logs both groups."""
    run_dir, log = tmp_path / "run", tmp_path / "trainer.log"
    args = [*TINY_RUN, "--problems", "builtin", "--problems-per-step", "2", "--updates", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    with log.open("ab") as out:
        done = subprocess.run(
            [*torchrun, "-m", "services.trainer", *args, *services, "--output-dir", str(run_dir)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    assert done.returncode == 0, log.read_text()[-4000:]
    (metrics,) = _lines(run_dir / "metrics.jsonl")
    assert metrics["samples"] + metrics["rate/left_out"] * 8 == pytest.approx(8)  # 2 problems x 2 x 2 turns
    episodes = _lines(run_dir / "episodes.jsonl")
    assert len(episodes) == 8 and len({e["problem_id"] for e in episodes}) == 2
    assert (run_dir / "final" / "adapter_config.json").exists()
