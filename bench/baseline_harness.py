"""A KernelBench-style evaluation harness, written only to compare our evaluator against.

It does what a typical KernelBench eval loop does: everything in one process, `load_inline` at module import with
torch's default build settings, inputs from `get_inputs()` on the host moved to the GPU, a fixed seed, 5
correctness trials at atol = rtol = 1e-2, then 3 warm-ups and 100 CUDA-event-timed trials of the candidate (mean,
no L2 flush, one input set), candidates one after another. The reference is timed the same way once per problem.
Modules are imported from temporary files (exec of a string breaks Triton's @jit, as in exec-based loaders).
A candidate that leaves a sticky CUDA error kills the process's context; the driver then starts a fresh process
for the rest, as a user of such a harness has to. It has no sandbox and no hack checks: never give it untrusted code.

usage: python bench/baseline_harness.py --out results.jsonl [--only NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "bench" / "candidates"
SEED = 42
CORRECTNESS_TRIALS = 5
WARMUP = 3
TRIALS = 100
TOL = 1e-2
PROFILE = "gpu"


def load_module(name: str, source: str) -> types.ModuleType:
    """Import `source` from a temporary file (Triton's @jit reads its function's source back from the file)."""
    path = Path(tempfile.mkdtemp(prefix="baseline_src_")) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # trusted bench code only
    return module


def time_mean_ms(torch, fn, inputs) -> float:
    with torch.no_grad():
        for _ in range(WARMUP):
            fn(*inputs)
        torch.cuda.synchronize()
        total = 0.0
        for _ in range(TRIALS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            total += start.elapsed_time(end)
    return total / TRIALS


def evaluate(torch, entry: dict, reference_ms: dict[str, float]) -> dict:
    from problems import get_problem

    result: dict = {"file": entry["file"], "problem": entry["problem"]}
    ref = load_module("reference", get_problem(entry["problem"], PROFILE).source)
    init = ref.get_init_inputs()
    torch.manual_seed(SEED)
    model = ref.Model(*init).cuda()
    t0 = time.perf_counter()
    try:
        cand = load_module(entry["file"].removesuffix(".py"), (CANDIDATES / entry["file"]).read_text())
        torch.manual_seed(SEED)
        new = cand.ModelNew(*init).cuda()
    except Exception as exc:  # the harness reports every candidate failure as a verdict
        result.update(status="compile_error", compile_s=time.perf_counter() - t0, message=repr(exc)[:500])
        return result
    result["compile_s"] = time.perf_counter() - t0
    try:
        with torch.no_grad():
            for trial in range(CORRECTNESS_TRIALS):
                torch.manual_seed(SEED + trial)
                inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
                expected, got = model(*inputs), new(*inputs)
                torch.cuda.synchronize()
                if got.shape != expected.shape or not torch.allclose(got, expected, atol=TOL, rtol=TOL):
                    result.update(status="incorrect", trial=trial)
                    return result
            candidate_ms = time_mean_ms(torch, new, inputs)
            if entry["problem"] not in reference_ms:
                reference_ms[entry["problem"]] = time_mean_ms(torch, model, inputs)
    except Exception as exc:
        result.update(status="runtime_error", message=repr(exc)[:500])
        return result
    result.update(
        status="correct",
        candidate_ms=candidate_ms,
        reference_ms=reference_ms[entry["problem"]],
        speedup=reference_ms[entry["problem"]] / candidate_ms,
    )
    return result


def context_alive(torch) -> bool:
    try:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def run_in_process(entries: list[dict], out: Path) -> None:
    """Evaluate entries in order, appending one JSON line each; exit 3 once the CUDA context is dead."""
    import torch

    reference_ms: dict[str, float] = {}
    for entry in entries:
        t0 = time.perf_counter()
        try:
            result = evaluate(torch, entry, reference_ms)
        except Exception:
            result = {"file": entry["file"], "status": "harness_error", "message": traceback.format_exc()[-800:]}
        result["wall_s"] = time.perf_counter() - t0
        with out.open("a") as handle:
            handle.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)
        if not context_alive(torch):
            sys.exit(3)


def finished(out: Path) -> set[str]:
    return {json.loads(line)["file"] for line in out.read_text().splitlines()} if out.exists() else set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per candidate")
    ap.add_argument("--only", nargs="*", help="candidate files to run (default: the whole manifest)")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", choices=("cpu", "gpu"), default="gpu", help="problem sizes")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    manifest = json.loads((CANDIDATES / "manifest.json").read_text())
    entries = [e for e in manifest if not args.only or e["file"] in args.only]
    if args.only:
        entries.sort(key=lambda e: args.only.index(e["file"]))
    if args.in_process:
        run_in_process(entries, args.out)
        return
    args.out.unlink(missing_ok=True)
    # a fresh extensions directory, so every build is cold as on a new machine
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": tempfile.mkdtemp(prefix="baseline_ext_")}
    t0 = time.perf_counter()
    while True:
        done = finished(args.out)
        rest = [e["file"] for e in entries if e["file"] not in done]
        if not rest:
            break
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--in-process",
                "--out",
                str(args.out),
                "--profile",
                args.profile,
                "--only",
                *rest,
            ],
            env=env,
            check=False,
        )
        if finished(args.out) == done:
            # the process died before finishing its first candidate: record it and go on
            with args.out.open("a") as handle:
                handle.write(json.dumps({"file": rest[0], "status": "crashed"}) + "\n")
    print(json.dumps({"baseline_total_s": time.perf_counter() - t0, "candidates": len(entries)}), flush=True)


if __name__ == "__main__":
    main()
