"""bench/learning.py's summary reports the share of suggestions that changed the kernel, early against late."""

from __future__ import annotations

import importlib.util
import json

from tests.servers import REPO


def test_summary_reports_the_kernel_changed_share(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_learning", REPO / "bench" / "learning.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results")
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"update": u, "reward/mean": 1.0, "reward/std": 0.1, "rate/correct": 1.0, "rate/kernel_changed": c}
        for u, c in ((1, 0.25), (2, 0.25), (3, 0.75), (4, 0.75))
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    turn = {"update": 1, "problem_id": "p", "suggestion": "Fuse the chain of element-wise ops", "reward": 1.0}
    (run / "episodes.jsonl").write_text(json.dumps(turn) + "\n")
    summary = bench.summarize(run, "configs/default.yaml", None, "test")
    assert (summary["first_kernel_changed"], summary["last_kernel_changed"]) == (0.25, 0.75)
    assert summary["curve"][0]["rate/kernel_changed"] == 0.25
    assert (tmp_path / "results" / "test.png").exists()
