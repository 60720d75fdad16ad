"""A run that cannot learn must say so: dead services fail at start (naming the URL and the fix) before the model
loads, and a run whose every turn was left out writes no final/ and fails."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from services.trainer.episodes import Services, ServiceSettings, ServicesUnavailable, check_services
from services.trainer.replicas import ReplicaPool
from services.trainer.reward import RewardValues
from shared.clients import ServiceError
from shared.contracts import ImplementResponse
from tests.servers import REPO, free_port


def test_dead_services_are_named_with_the_fix():
    evaluator, implementer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServicesUnavailable) as caught:
        check_services([evaluator], [implementer], None, retries=0)
    message = str(caught.value)
    assert f"evaluator at {evaluator}" in message and f"implementer at {implementer}" in message
    assert "kernel-agent serve evaluator" in message and "--implementer-url" in message


def test_the_trainer_exits_1_at_start_when_the_evaluator_is_dead(tmp_path):
    run_dir = tmp_path / "run"
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "services.trainer", "--config", "configs/default.yaml"]
        + ["--evaluator-url", dead, "--implementer-url", dead, "--request-retries", "0"]
        + ["--output-dir", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"evaluator at {dead}" in out.stderr and "fix:" in out.stderr
    assert "converting" not in out.stderr and not run_dir.exists()  # failed before anything was loaded or written
    assert time.monotonic() - started < 120


class Answers:
    """An implementer that rewrites nothing and an evaluator that always fails (HTTP 500)."""

    async def implement(self, request):
        return ImplementResponse(status="ok", backend="fake", source=request.current_source)

    async def evaluate(self, request):
        raise ServiceError("http://evaluator", 500, "the sandbox could not start")

    async def aclose(self) -> None:
        return None


def test_a_run_that_learned_from_nothing_fails_without_final(tmp_path, monkeypatch):
    from services.trainer import grpo

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # keep pytest's own SIGINT handler
    from services.trainer.config import TrainConfig

    config = TrainConfig(
        model="random:smollm2-tiny",
        problems="builtin/elementwise_chain",
        problems_per_step=1,
        num_trajectories=2,
        max_steps_per_episode=1,
        max_new_tokens=4,
        max_prompt_tokens=1024,
        updates=1,
        output_dir=str(tmp_path / "run"),
        evaluator_urls=["http://evaluator"],
        implementer_urls=["http://implementer"],
    )
    settings = ServiceSettings("cuda", "auto", 3, 1, 1, False, None, True, RewardValues())
    fake = Services(ReplicaPool(["i"], lambda _: Answers()), ReplicaPool(["e"], lambda _: Answers()), settings)
    monkeypatch.setattr(grpo, "check_services", lambda *args: {})
    monkeypatch.setattr(grpo, "make_services", lambda *args: fake)
    with pytest.raises(grpo.NothingLearned, match="final was not written"):
        grpo.train(config)
    run = tmp_path / "run"
    assert not (run / "final").exists()
    assert (run / "metrics.jsonl").exists()  # what happened stays readable


def test_a_prompt_budget_without_room_for_the_kernels_fails_before_the_rollout(tmp_path, monkeypatch):
    from services.implementer.backends.builtin import BuiltinBackend
    from services.trainer import grpo
    from services.trainer.config import ConfigError, TrainConfig
    from shared.contracts import HealthResponse

    monkeypatch.setattr(signal, "signal", lambda *args: None)
    health = HealthResponse(service="implementer", version="test", details=BuiltinBackend().describe())
    monkeypatch.setattr(grpo, "check_services", lambda *args: {"http://implementer": health})
    monkeypatch.setattr(grpo, "run_episodes", None)  # never reached
    config = TrainConfig(
        model="random:smollm2-tiny",
        prompt_techniques=True,  # the menu alone is about 590 tokens
        max_new_tokens=16,
        max_prompt_tokens=700,
        output_dir=str(tmp_path / "run"),
        evaluator_urls=["http://evaluator"],
        implementer_urls=["http://implementer"],
    )
    with pytest.raises(ConfigError, match="max_prompt_tokens 700 leaves no room for the kernels.*technique menu"):
        grpo.train(config)
