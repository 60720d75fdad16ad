"""Split and whole builds of the CUDA corpus give the same verdicts (split_build.py).

Every candidate of tests/evaluator/cuda_corpus is built twice through build_cache.build, once with the split
build asked for (EVALUATOR_SPLIT_BUILD=1) and once whole, each in a process of its own, loaded and checked
against its reference on the GPU. The verdicts must be identical, the whole build's must be the one the corpus
expects, and the splitter must accept at least 80 % of the corpus. `SPLIT_BUILD_REPORT=file.json` keeps the runs
(build seconds per path, errors, output digests) for BENCHMARKS.md.

Run from the source tree on a CUDA machine: `PYTHONPATH=. python -m pytest -m gpu tests/evaluator/gpu/test_split_build_gpu.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tree_sitter_cuda")

from services.evaluator import pch  # noqa: E402
from tests.evaluator import cuda_corpus  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPO_ROOT = Path(__file__).resolve().parents[3]
PARALLEL = int(os.environ.get("SPLIT_BUILD_PARALLEL", max(2, (os.cpu_count() or 4) // 2)))


def _run(case: str, path: str, cache_dir: Path, build_root: Path) -> dict[str, Any]:
    env = {**os.environ, "MAX_JOBS": "2", "PYTHONPATH": str(REPO_ROOT)}
    command = [
        sys.executable,
        "-m",
        "tests.evaluator.gpu.split_corpus_runner",
        case,
        path,
        str(cache_dir),
        str(build_root),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=900, check=False)
    except subprocess.TimeoutExpired:
        return {"case": case, "path": path, "verdict": "timeout"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    # The process died before it could answer: a crash, which both paths must share too.
    return {"case": case, "path": path, "verdict": "crashed", "message": (done.stdout + done.stderr)[-2000:]}


def test_split_and_whole_builds_give_identical_verdicts(tmp_path: Path) -> None:
    cache_dir, build_root = tmp_path / "cache", tmp_path / "build"
    cache_dir.mkdir()
    # What the service does at start-up (pch.main): both precompiled headers for its default flags.
    assert pch.ensure_pch(cache_dir, ["-O3"], with_cuda=True) is not None
    assert pch.ensure_pch(cache_dir, ["-O3"], with_cuda=True, header=pch.TYPES_HEADER) is not None
    cases = cuda_corpus.cases()
    assert len(cases) >= 40
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in ("split", "whole"):
        with ThreadPoolExecutor(PARALLEL) as pool:
            runs[path] = list(pool.map(lambda c, p=path: _run(c.name, p, cache_dir, build_root), cases))
    report: dict[str, Any] = {"cases": len(cases), "runs": runs}
    if os.environ.get("SPLIT_BUILD_REPORT"):
        # Cold builds again, the bindings now cached: what a candidate costs once its declarations were seen.
        with ThreadPoolExecutor(PARALLEL) as pool:
            warm = list(pool.map(lambda c: _run(c.name, "split", cache_dir, build_root / "warm"), cases))
        runs["split_binding_cached"] = warm
        warm_times = [r["build_s"] for r in warm if r.get("build_path") == "split"]
        report["median_split_build_binding_cached_s"] = statistics.median(warm_times) if warm_times else None
    split_times = [r["build_s"] for r in runs["split"] if r.get("build_path") == "split"]
    whole_times = [r["build_s"] for r in runs["whole"] if "build_s" in r]
    report["median_split_build_s"] = statistics.median(split_times) if split_times else None
    report["median_whole_build_s"] = statistics.median(whole_times) if whole_times else None
    if os.environ.get("SPLIT_BUILD_REPORT"):
        Path(os.environ["SPLIT_BUILD_REPORT"]).write_text(json.dumps(report, indent=1))
    mismatches = [
        (case.name, split["verdict"], whole["verdict"])
        for case, split, whole in zip(cases, runs["split"], runs["whole"], strict=True)
        if split["verdict"] != whole["verdict"]
    ]
    assert not mismatches, mismatches
    unexpected = [
        (case.name, case.expect, whole["verdict"], whole.get("message", "")[-300:])
        for case, whole in zip(cases, runs["whole"], strict=True)
        if whole["verdict"] != case.expect
    ]
    assert not unexpected, unexpected
    # Candidates that fail to compile fall back by design; the splitter must accept at least 80 % of the corpus.
    accepted = sum(r.get("build_path") in ("split", "fallback") for r in runs["split"])
    assert accepted >= 0.8 * len(cases), [(r["case"], r.get("build_path")) for r in runs["split"]]
