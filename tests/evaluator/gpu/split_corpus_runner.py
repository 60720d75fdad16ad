"""One corpus candidate, built split or whole as the evaluator's builder does, then checked against its reference.

`python -m tests.evaluator.gpu.split_corpus_runner CASE split|whole CACHE_DIR BUILD_ROOT` prints one JSON line:
the verdict (compile_error, runtime_error, incorrect, correct), the build path that ran (split, fallback, whole),
the build's seconds (wall, and CPU: this process's and its compilers') and a digest of the outputs. A process of
its own per run, so a device fault stays in it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from services.evaluator import build_cache
from tests.evaluator import cuda_corpus

TRIALS = 3
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _builder(path: str, cache_dir: Path, build_root: Path, report: dict[str, Any]) -> Any:
    """A stand-in for load_inline that builds through build_cache.build and loads the result."""
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(**arguments: Any) -> Any:
        os.environ["EVALUATOR_SPLIT_BUILD"] = "1" if path == "split" else "0"
        kind, parsed = build_cache.parse_request({"kind": "load_inline", "arguments": arguments}, "cuda")
        key = build_cache.cache_key(kind, parsed, build_cache.device_arch("cuda"))
        build_dir = build_root / path / key
        build_dir.mkdir(parents=True, exist_ok=True)
        # A build that raises was decided by the whole build: after a split that failed, or without one.
        report["build_path"] = "fallback" if build_cache.SPLIT_ARGUMENT in parsed else "whole"
        started, cpu_started = time.perf_counter(), _cpu_s()
        stand_in, cpp_extension.load_inline = cpp_extension.load_inline, original
        try:
            built = build_cache.build({"kind": kind, "arguments": parsed, "key": key}, build_dir, "cuda", cache_dir)
            report["build_path"], report["parts_s"] = built.build_path, built.parts_s
        finally:
            cpp_extension.load_inline = stand_in
            report["build_s"] = round(time.perf_counter() - started, 2)
            report["build_cpu_s"] = round(_cpu_s() - cpu_started, 2)
        name = build_cache.library_name(key)
        return build_cache._load_library(build_dir / f"{name}.so", name, True)

    # parse_request reads the signature of cpp_extension.load_inline: keep the original's.
    return functools.wraps(original)(load_inline)


def _cpu_s() -> float:
    """CPU seconds used by this process and its children that were waited for: the build's compilers, each
    counted once it has exited (ninja waits for them, this process for ninja)."""
    usages = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    return sum(usage.ru_utime + usage.ru_stime for usage in usages)


def _flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _flatten(item)]
    return []


def _compare(expected: Any, actual: Any) -> tuple[bool, float]:
    want, got = _flatten(expected), _flatten(actual)
    if len(want) != len(got):
        return False, float("inf")
    worst = 0.0
    for e, a in zip(want, got, strict=True):
        if e.shape != a.shape or e.dtype != a.dtype:
            return False, float("inf")
        tol = TOLERANCE.get(e.dtype, 1e-4)
        diff = (a.double() - e.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(a.double(), e.double(), atol=tol, rtol=tol) or (a.isnan() != e.isnan()).any():
            return False, worst
    return True, worst


def run(case_name: str, path: str, cache_dir: Path, build_root: Path) -> dict[str, Any]:
    case = next(c for c in cuda_corpus.cases() if c.name == case_name)
    report: dict[str, Any] = {"case": case_name, "path": path}
    import torch.utils.cpp_extension as cpp_extension

    cpp_extension.load_inline = _builder(path, cache_dir, build_root, report)
    reference: dict[str, Any] = {"__name__": "reference"}
    exec(compile(case.reference_source, "reference.py", "exec"), reference)
    candidate: dict[str, Any] = {"__name__": "candidate"}
    try:
        exec(compile(case.source, f"{case_name}.py", "exec"), candidate)
        torch.manual_seed(0)
        model = reference["Model"](*reference["get_init_inputs"]()).cuda()
        torch.manual_seed(0)
        model_new = candidate["ModelNew"](*reference["get_init_inputs"]()).cuda()
    except Exception as error:
        return {**report, "verdict": "compile_error", "message": f"{type(error).__name__}: {str(error)[-1500:]}"}
    digest = hashlib.sha256()
    worst = 0.0
    for trial in range(TRIALS):
        torch.manual_seed(1000 + trial)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in reference["get_inputs"]()]
        with torch.no_grad():
            expected = model(*inputs)
            try:
                actual = model_new(*inputs)
                torch.cuda.synchronize()
            except Exception as error:
                return {**report, "verdict": "runtime_error", "message": f"{type(error).__name__}: {str(error)[-500:]}"}
        same, error = _compare(expected, actual)
        worst = max(worst, error)
        for tensor in _flatten(actual):
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        if not same:
            return {**report, "verdict": "incorrect", "max_abs_error": error}
    return {**report, "verdict": "correct", "max_abs_error": worst, "digest": digest.hexdigest()[:16]}


def main() -> None:
    case_name, path, cache_dir, build_root = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    try:
        result = run(case_name, path, cache_dir, build_root)
    except Exception:
        result = {
            "case": case_name,
            "path": path,
            "verdict": "harness_error",
            "message": traceback.format_exc()[-2000:],
        }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
