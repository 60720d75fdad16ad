"""bench/learning_gpu.py's statistics: stratified bootstrap intervals and the before/after report."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.servers import REPO

spec = importlib.util.spec_from_file_location("bench_learning_gpu", REPO / "bench" / "learning_gpu.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def sample(problem: str, reward: float | None, changed: bool | None) -> dict:
    return {"problem_id": problem, "reward": reward, "kernel_changed": changed, "verdict": "correct"}


def test_resampling_within_problems_keeps_the_problem_mix():
    # 8 samples of 0 and 2 of 10: every stratified resample has the same mean, 20 / 10 = 2.0; resampling the 10
    # samples as one pool would move it.
    grouped = {"a": [0.0] * 8, "b": [10.0, 10.0]}
    summary = bench.describe(grouped, 500, seed=1)
    assert summary["mean"] == pytest.approx(2.0)
    assert summary["ci95"] == pytest.approx([2.0, 2.0])


def test_a_clear_improvement_has_an_interval_above_zero():
    before = {"a": [1.0, 1.2, 0.8, 1.0] * 2, "b": [1.3, 1.1, 1.2, 1.4] * 2}
    after = {"a": [2.0, 2.2, 1.8, 2.0] * 2, "b": [2.3, 2.1, 2.2, 2.4] * 2}
    result = bench.compare(before, after, 2000, seed=0)
    assert result["difference"]["mean"] == pytest.approx(1.0)
    low, high = result["difference"]["ci95"]
    assert 0 < low < 1.0 < high
    assert result["relative_change"]["value"] == pytest.approx(1.0 / 1.125)


def test_no_change_has_an_interval_around_zero():
    noisy = {"a": [0.0, 2.0, 1.0, 3.0, 0.5, 1.5, 2.5, 0.0]}
    result = bench.compare(noisy, noisy, 2000, seed=0)
    low, high = result["difference"]["ci95"]
    assert low < 0 < high


def test_relative_change_of_a_share_that_starts_at_zero_is_undefined():
    result = bench.compare({"a": [0.0] * 8}, {"a": [1.0] * 8}, 200, seed=0)
    assert result["difference"]["mean"] == 1.0
    assert result["relative_change"] == {"value": None, "ci95": None}


def test_left_out_samples_count_for_the_kernel_changed_share_not_the_reward():
    samples = [sample("a", 1.3, False), sample("a", None, None), sample("a", 2.3, True), sample("b", -1.0, True)]
    assert bench.by_problem(samples, "reward") == {"a": [1.3, 2.3], "b": [-1.0]}
    assert bench.by_problem(samples, "kernel_changed") == {"a": [0.0, 0.0, 1.0], "b": [1.0]}
    assert bench.by_problem(samples, "changed_kernel_reward") == {"a": [2.3], "b": [-1.0]}


def test_report_compares_the_two_evals_and_draws_the_curve(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    evals = {
        "before": [sample(p, 1.3, False) for p in "ab" for _ in range(8)],
        "after": [sample(p, 2.3, True) for p in "ab" for _ in range(8)],
    }
    for label, samples in evals.items():
        (run / f"eval-{label}.json").write_text(json.dumps({"label": label, "wall_s": 1.0, "samples": samples}))
    rows = [
        {
            "update": u,
            "reward/mean": 1.0 + u / 10,
            "reward/std": 0.1,
            "rate/correct": 1.0,
            "reward/frac_zero_std_groups": 0.5,
            "time/update_s": 10.0,
        }
        for u in range(1, 7)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = bench.build_report(run, tmp_path / "out", resamples=200)
    assert report["reward"]["difference"]["mean"] == pytest.approx(1.0)
    assert report["kernel_changed"]["after"]["mean"] == 1.0
    # no sample before training changed its kernel: the changed kernels' reward has no before, and no difference
    assert report["changed_kernel_reward"]["after"]["mean"] == pytest.approx(2.3)
    assert report["changed_kernel_reward"]["difference"] == {"mean": None, "ci95": None}
    assert report["target"]["met"] is True
    assert report["training"]["updates"] == 6
    assert set(report["reward_per_problem"]) == {"a", "b"}
    assert json.loads((tmp_path / "out" / "report.json").read_text())["target"]["met"] is True
    assert (tmp_path / "out" / "reward_curve.png").exists()


def test_an_eval_goes_on_from_its_chunks_and_ignores_another_policys(tmp_path):
    """Chunks of the initial policy's eval, left by invocations that ran out of time, make the whole eval without a
    service or a model; a chunk left by another policy (the `after` eval of an older checkpoint) is not used."""
    import argparse

    from problems import load_problems

    problems = load_problems("builtin")[:6]
    run = tmp_path / "run"
    run.mkdir()
    args = argparse.Namespace(run_dir=run, out=tmp_path / "out", eval_samples=1, eval_problems=6, device="cpu")
    args.out.mkdir()

    def chunk(i: int, policy: str, reward: float) -> dict:
        ids = [p.id for p in problems[i * bench.EVAL_CHUNK_PROBLEMS : (i + 1) * bench.EVAL_CHUNK_PROBLEMS]]
        samples = [sample(p, reward, True) for p in ids]
        return {
            "chunk": i,
            "policy": policy,
            "samples_per_problem": 1,
            "problems": ids,
            "wall_s": 2.0,
            "samples": samples,
        }

    initial = "initial (no adapter weights)"
    rows = [chunk(0, "update-000005", 9.0), chunk(1, initial, 2.0), chunk(0, initial, 1.0)]
    partial = run / "eval-before.partial.jsonl"
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--config", str(REPO / "configs" / "learning-gpu.yaml"), "--output-dir", str(run)]
    assert bench.held_out_eval("before", argv, args, deadline=0.0) is True
    result = json.loads((args.out / "eval-before.json").read_text())
    assert [s["reward"] for s in result["samples"]] == [1.0] * 4 + [2.0] * 2  # in problem order, 9.0 left out
    assert result["wall_s"] == 4.0 and not partial.exists()
