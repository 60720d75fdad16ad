"""Our evaluator service against the KernelBench-style baseline harness, on the same 32 candidates (GPU only).

Measures, for the service (real `python -m services.evaluator` on 127.0.0.1, fresh build cache):
- throughput: all candidates submitted at once, candidates per hour from the wall time of the whole batch;
- cold compile per CUDA candidate: its cold evaluation minus the same evaluation again with the cache warm;
- cache-hit latency: the time `load_inline` takes on a hit, with the worker's caching loader, in a fresh process;
- speedup CV: one candidate evaluated 10 times in a row, coefficient of variation of its speedup;
- where a cold batch's time goes: each evaluation's `phases_s` (median per candidate kind) and how busy the CPU
  cores were during the batch (`/proc/stat`, once a second).
The baseline (bench/baseline_harness.py) runs in the same invocation unless `--baseline FILE` reuses its output.

usage: python bench/evaluator_gpu.py --out DIR [--workers 8] [--profile cpu] [--baseline-budget-s S] [--batch-only]
BENCHMARKS.md ("Evaluator on the GPU") has the numbers and the exact command.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from problems import get_problem  # noqa: E402
from services.evaluator import split_build  # noqa: E402
from tests.servers import run_service  # noqa: E402

CANDIDATES = REPO / "bench" / "candidates"
CV_CANDIDATE = "cuda_scale_shift_clamp.py"
CV_REPEATS = 10
WARM_REPEATS = 5
SEED = 42

HIT_PROBE = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from services.evaluator import build_cache
import torch, torch.utils.cpp_extension
build_cache.install(Path({cache!r}), Path({tmp!r}), "cuda", lambda *a, **k: None)
source = Path({candidate!r}).read_text()
t0 = time.perf_counter()
exec(compile(source, "candidate", "exec"), {{"__name__": "candidate"}})
print(json.dumps({{"import_s": time.perf_counter() - t0}}))
"""


def request(entry: dict, profile: str, **overrides: object) -> dict:
    return {
        "reference_source": get_problem(entry["problem"], profile).source,
        "candidate_source": (CANDIDATES / entry["file"]).read_text(),
        "device": "cuda",
        "correctness_trials": 3,
        "timing_trials": 100,
        "warmup_trials": 3,
        "seed": SEED,
        "timeout_s": 900,
        **overrides,
    }


def post(url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    response = httpx.post(f"{url}/evaluate", json=body, timeout=1800)
    response.raise_for_status()
    return {**response.json(), "client_s": time.perf_counter() - t0}


def wait_for_pch(cache: Path, limit_s: float = 300) -> float:
    """Seconds until the service's start-up headers are built: torch/extension.h's, and with split builds on the
    host code's and the binding's too."""
    wanted = 3 if split_build.enabled() else 1
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        # staging directories are named <key>.<suffix>; only a renamed (finished) one counts
        if sum("." not in p.parent.name for p in (cache / "pch").glob("*/*.gch")) >= wanted:
            return time.perf_counter() - t0
        time.sleep(1)
    return float("nan")


def cache_hit_seconds(cache: Path, entry: dict) -> float:
    """Import a candidate whose extension is cached, in a fresh process, with the worker's caching loader."""
    with tempfile.TemporaryDirectory() as tmp:
        code = HIT_PROBE.format(repo=str(REPO), cache=str(cache), tmp=tmp, candidate=str(CANDIDATES / entry["file"]))
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        if run.returncode != 0:
            print(run.stderr[-1500:], file=sys.stderr)
            return float("nan")
        return json.loads(run.stdout.strip().splitlines()[-1])["import_s"]


class CpuSampler:
    """Share of all cores busy, once a second, from /proc/stat (Linux), while the `with` block runs."""

    def __init__(self) -> None:
        self.busy: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _run(self) -> None:
        busy, total = self._read()
        while not self._stop.wait(1.0):
            busy2, total2 = self._read()
            self.busy.append((busy2 - busy) / max(1, total2 - total))
            busy, total = busy2, total2

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def phase_medians(manifest: list[dict], results: list[dict]) -> dict[str, dict[str, float]]:
    """Median seconds per phase (the service's `phases_s`) for each candidate kind."""
    by_kind: dict[str, dict[str, list[float]]] = {}
    for entry, result in zip(manifest, results, strict=True):
        for phase, seconds in (result.get("phases_s") or {}).items():
            by_kind.setdefault(entry["kind"], {}).setdefault(phase, []).append(seconds)
    return {
        kind: {phase: round(statistics.median(values), 2) for phase, values in phases.items()}
        for kind, phases in by_kind.items()
    }


def run_ours(manifest: list[dict], workers: int, profile: str, out: Path, batch_only: bool = False) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="evaluator_cache_"))
    cpus = os.cpu_count() or 1
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "EVALUATOR_CACHE_DIR": str(cache),
        "EVALUATOR_WORKERS": str(workers),
        "EVALUATOR_BUILD_WORKERS": str(workers),
        "EVALUATOR_BUILD_JOBS": str(max(2, cpus // workers)),
        "EVALUATOR_MAX_FILE_MB": "8192",
        "EVALUATOR_DEFAULT_TIMEOUT_S": "900",
    }
    report: dict = {"workers": workers, "cpus": cpus, "profile": profile}
    with run_service("evaluator", env=env, log_path=out / "service.log", timeout_s=300) as url:
        report["pch_ready_s"] = wait_for_pch(cache)
        t0 = time.perf_counter()
        progress, progress_lock = (out / "cold_progress.jsonl").open("w"), threading.Lock()

        def post_and_record(entry: dict) -> dict:
            # Each result as it comes: a batch stopped early (a lease's time limit) still says what it did.
            result = post(url, request(entry, profile))
            with progress_lock:
                progress.write(json.dumps({"file": entry["file"], "at_s": time.perf_counter() - t0, **result}) + "\n")
                progress.flush()
            return result

        with progress, CpuSampler() as cpu, ThreadPoolExecutor(len(manifest)) as pool:
            cold = list(pool.map(post_and_record, manifest))
        report["cold_batch_s"] = time.perf_counter() - t0
        report["cpu_busy_during_batch"] = {
            "mean": statistics.fmean(cpu.busy) if cpu.busy else None,
            "per_second": [round(b, 3) for b in cpu.busy],
        }
        report["phases_median_s"] = phase_medians(manifest, cold)
        report["results"] = [
            {
                "file": e["file"],
                "expect": e["expect"],
                **{k: r.get(k) for k in ("status", "speedup", "flags", "duration_s", "client_s", "cache_hit")},
                "phases_s": r.get("phases_s"),
                "message": (r.get("message") or "")[-300:],
            }
            for e, r in zip(manifest, cold, strict=True)
        ]
        (out / "cold_results.json").write_text(json.dumps({"report": report, "cold": cold}, indent=1))
        print(
            f"cold batch of {len(manifest)}: {report['cold_batch_s']:.1f} s, "
            f"CPU busy {report['cpu_busy_during_batch']['mean']}, phases {report['phases_median_s']}",
            flush=True,
        )
        if batch_only:
            return report
        cuda_ok = [
            (e, r) for e, r in zip(manifest, cold, strict=True) if e["kind"] == "cuda" and r["status"] == "correct"
        ]
        cuda_ok = cuda_ok[:WARM_REPEATS]
        warm = [post(url, request(e, profile)) for e, _ in cuda_ok]
        report["cold_compile_s"] = {
            e["file"]: r["duration_s"] - w["duration_s"] for (e, r), w in zip(cuda_ok, warm, strict=True)
        }
        report["warm_cache_hit"] = {e["file"]: w["cache_hit"] for (e, _), w in zip(cuda_ok, warm, strict=True)}
        report["warm_eval_s"] = {e["file"]: w["duration_s"] for (e, _), w in zip(cuda_ok, warm, strict=True)}
        cv_entry = next(e for e in manifest if e["file"] == CV_CANDIDATE)
        # the same inputs every time: the spread is the timer's, not the data's
        # at GPU sizes (1 GiB input): the CV is about timing a real kernel, not launch latency
        repeats = [post(url, request(cv_entry, "gpu", correctness_trials=1)) for _ in range(CV_REPEATS)]
    speedups = [r["speedup"] for r in repeats if r.get("speedup")]
    report["cv"] = {
        "candidate": CV_CANDIDATE,
        "speedups": speedups,
        "cv": statistics.pstdev(speedups) / statistics.fmean(speedups) if len(speedups) > 1 else None,
    }
    report["cache_hit_import_s"] = {e["file"]: cache_hit_seconds(cache, e) for e, _ in cuda_ok[:5]}
    return report


def run_baseline(out: Path, profile: str, budget_s: float | None) -> tuple[list[dict], float]:
    """Run the harness; past `budget_s`, estimate each unrun CUDA candidate by the mean of the run ones."""
    path = out / "baseline.jsonl"
    manifest = json.loads((CANDIDATES / "manifest.json").read_text())
    # cheap candidates first, so a budget cut leaves only CUDA builds to estimate
    order = sorted(manifest, key=lambda e: e["kind"] == "cuda")
    cmd = [
        sys.executable,
        str(REPO / "bench" / "baseline_harness.py"),
        "--out",
        str(path),
        "--profile",
        profile,
        "--only",
        *[e["file"] for e in order],
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    elapsed = time.perf_counter() - t0
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = {r["file"] for r in rows}
    cuda_walls = [r["wall_s"] for r in rows if r["file"].startswith("cuda_") and "wall_s" in r]
    missing = [e["file"] for e in manifest if e["file"] not in done]
    if missing and cuda_walls:
        estimate = statistics.fmean(cuda_walls)
        rows += [{"file": f, "status": "estimated", "wall_s": estimate} for f in missing]
        elapsed += estimate * len(missing)
    return rows, elapsed


def summarize(ours: dict, baseline: list[dict] | None, baseline_s: float | None, n: int) -> dict:
    compile_s = list(ours.get("cold_compile_s", {}).values())
    hits = list(ours.get("cache_hit_import_s", {}).values())
    warm = list(ours.get("warm_eval_s", {}).values())
    summary = {
        "candidates": n,
        "ours_cold_batch_s": ours["cold_batch_s"],
        "ours_candidates_per_hour": n / ours["cold_batch_s"] * 3600,
        "ours_cold_compile_median_s": statistics.median(compile_s) if compile_s else None,
        "ours_cache_hit_median_s": statistics.median(hits) if hits else None,
        "ours_warm_eval_median_s": statistics.median(warm) if warm else None,
        "speedup_cv": ours.get("cv", {}).get("cv"),
        "ours_verdicts_match_expectation": sum(r["status"] == r["expect"] for r in ours["results"]),
        "cpu_busy_during_batch": ours["cpu_busy_during_batch"]["mean"],
        "phases_median_s": ours["phases_median_s"],
    }
    if baseline is not None and baseline_s:
        base_compile = [r["compile_s"] for r in baseline if r.get("compile_s") and r["file"].startswith("cuda_")]
        summary |= {
            "baseline_total_s": baseline_s,
            "baseline_candidates_per_hour": n / baseline_s * 3600,
            "baseline_cold_compile_median_s": statistics.median(base_compile) if base_compile else None,
            "throughput_ratio": (n / ours["cold_batch_s"]) / (n / baseline_s),
        }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--workers", type=int, default=8, help="evaluations at once (builds in parallel, GPU in turn)")
    ap.add_argument("--baseline", type=Path, help="reuse baseline_harness.py output (JSON lines) instead of running it")
    ap.add_argument("--baseline-seconds", type=float, help="wall time of that baseline run")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--batch-only", action="store_true", help="only the cold batch (no warm repeats, CV, cache probe)")
    ap.add_argument(
        "--profile",
        choices=("cpu", "gpu"),
        default="cpu",
        help="problem sizes for the 32-candidate runs (the CV run always uses gpu sizes); gpu sizes "
        "move 1 GiB tensors through the service's files and need far more host memory per worker",
    )
    ap.add_argument(
        "--baseline-budget-s",
        type=float,
        default=None,
        help="stop the baseline after this long; unrun CUDA candidates are then estimated",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((CANDIDATES / "manifest.json").read_text())
    ours = run_ours(manifest, args.workers, args.profile, args.out, args.batch_only)
    (args.out / "evaluator_gpu.json").write_text(json.dumps(ours, indent=1))
    baseline, baseline_s = None, None
    if args.baseline:
        baseline = [json.loads(line) for line in args.baseline.read_text().splitlines()]
        baseline_s = args.baseline_seconds
    elif not args.skip_baseline:
        baseline, baseline_s = run_baseline(args.out, args.profile, args.baseline_budget_s)
    summary = summarize(ours, baseline, baseline_s, len(manifest))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for r in ours["results"]:
        print(f"{r['file']:40s} expect {r['expect']:14s} got {r['status']:14s} speedup {r['speedup']} {r['flags']}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
