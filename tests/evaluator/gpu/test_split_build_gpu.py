"""Split and whole builds of the CUDA corpus give the same verdicts (split_build.py).

Every candidate of tests/evaluator/cuda_corpus is built twice through build_cache.build, once with the split
build asked for (EVALUATOR_SPLIT_BUILD=1) and once whole, each in a process of its own, loaded and checked
against its reference on the GPU. The verdicts must be identical, the whole build's must be the one the corpus
expects, and the splitter must accept at least 80 % of the corpus. `SPLIT_BUILD_REPORT=file.json` keeps the runs
(build seconds per path, wall and CPU, errors, output digests) for BENCHMARKS.md, `SPLIT_BUILD_LOG=file.jsonl`
each run as it ends, `SPLIT_BUILD_WARM=1` a third round with the bindings cached, and `SPLIT_BUILD_PATHS=split` the split path alone.

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
# Where a toolchain's C++ exceptions do not cross the extension boundary, a throwing extension kills its process:
# on the GPU image (torch 2.11.0+cu130, g++ 13.3.0) every load_inline extension whose TORCH_CHECK fails dies of
# SIGSEGV, built by torch itself with no evaluator in the way (BENCHMARKS.md). Both verdicts get the same reward;
# the two paths must still agree (the mismatch check below).
ACCEPTED = {"runtime_error": {"runtime_error", "crashed"}}
PARALLEL = int(os.environ.get("SPLIT_BUILD_PARALLEL", max(2, (os.cpu_count() or 4) // 2)))


def _run(case: str, path: str, cache_dir: Path, build_root: Path) -> dict[str, Any]:
    # Keep the caller's PYTHONPATH: tree-sitter may be installed only there (the GPU machine's carried wheels), and
    # without it every split request silently takes the whole build.
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "MAX_JOBS": "2", "PYTHONPATH": os.pathsep.join(paths)}
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


def _run_all(path: str, cases: list[cuda_corpus.Case], cache_dir: Path, build_root: Path) -> list[dict[str, Any]]:
    """Every case on one build path; each result is appended to SPLIT_BUILD_LOG (JSON lines) as it arrives, so a run
    cut short by a time limit still leaves what it measured."""
    log = os.environ.get("SPLIT_BUILD_LOG")

    def run_and_log(case: cuda_corpus.Case) -> dict[str, Any]:
        result = _run(case.name, path, cache_dir, build_root)
        if log:
            with open(log, "a") as stream:
                stream.write(json.dumps({"round": path, **result}) + "\n")
        return result

    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(run_and_log, cases))


def test_split_and_whole_builds_give_identical_verdicts(tmp_path: Path) -> None:
    """SPLIT_BUILD_PATHS=split runs the split path alone and holds its verdicts to the ones the corpus expects of a
    whole build (about a fifth of the time: whole builds are the slow ones); the default runs both."""
    cache_dir, build_root = tmp_path / "cache", tmp_path / "build"
    cache_dir.mkdir()
    # What the service does at start-up (pch.main): the precompiled headers for its default flags.
    headers = ["torch/extension.h", pch.TYPES_HEADER, pch.BINDING_HEADER]
    with ThreadPoolExecutor(len(headers)) as pool:
        built = list(
            pool.map(lambda header: pch.ensure_pch(cache_dir, ["-O3"], with_cuda=True, header=header), headers)
        )
    assert None not in built, built
    cases = cuda_corpus.cases()
    assert len(cases) >= 40
    paths = os.environ.get("SPLIT_BUILD_PATHS", "split,whole").split(",")
    runs = {path: _run_all(path, cases, cache_dir, build_root / path) for path in paths}
    report: dict[str, Any] = {"cases": len(cases), "runs": runs}
    if os.environ.get("SPLIT_BUILD_WARM"):
        # Cold builds again, the bindings now cached: what a candidate costs once its declarations were seen.
        warm = _run_all("split", cases, cache_dir, build_root / "warm")
        runs["split_binding_cached"] = warm
    for path, results in runs.items():
        # The split rounds' medians are of the builds that took the split (not the fallbacks, not the refusals).
        taken = "split" if path.startswith("split") else path
        ran = [r for r in results if r.get("build_path", taken) == taken and "build_s" in r]
        report[f"median_{path}_build_s"] = statistics.median(r["build_s"] for r in ran) if ran else None
        report[f"median_{path}_build_cpu_s"] = statistics.median(r["build_cpu_s"] for r in ran) if ran else None
    if os.environ.get("SPLIT_BUILD_REPORT"):
        Path(os.environ["SPLIT_BUILD_REPORT"]).write_text(json.dumps(report, indent=1))
    if "whole" in runs and "split" in runs:
        mismatches = [
            (case.name, split["verdict"], whole["verdict"])
            for case, split, whole in zip(cases, runs["split"], runs["whole"], strict=True)
            if split["verdict"] != whole["verdict"]
        ]
        assert not mismatches, mismatches
    for path, results in runs.items():
        unexpected = [
            (case.name, case.expect, result["verdict"], result.get("message", "")[-300:])
            for case, result in zip(cases, results, strict=True)
            if result["verdict"] not in ACCEPTED.get(case.expect, {case.expect})
        ]
        assert not unexpected, (path, unexpected)
    if "split" in runs:
        # Candidates that fail to compile fall back by design; the splitter must accept at least 80 % of the corpus.
        accepted = sum(r.get("build_path") in ("split", "fallback") for r in runs["split"])
        assert accepted >= 0.8 * len(cases), [(r["case"], r.get("build_path")) for r in runs["split"]]
