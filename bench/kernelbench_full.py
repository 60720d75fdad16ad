"""Every KernelBench problem (levels 1-3, published sizes) scored against itself, by the evaluator service and by a
KernelBench-style in-process check, in one run.

The candidate of a problem is the reference's own code with the name `Model` renamed to `ModelNew` (name tokens
only: `class Model`, `super(Model, self)`, `Model(...)`; docstrings and comments keep theirs). Per problem:

1. service: a real `python -m services.evaluator` on 127.0.0.1 (`tests.servers.run_service`), POST /evaluate with
   the trial counts below and a fixed seed; the peak RSS of the service's process tree (service, workers, relays)
   is sampled with psutil while the request runs;
2. check: a child process (a crash or an out-of-memory of one problem does not end the run) imports both modules
   from files, seeds, builds `Model` and `ModelNew` on the device, draws `get_inputs()` on the device, compares
   every correctness trial with torch.allclose at KernelBench's tolerance (atol = rtol = 1e-2; seeded again before
   each forward, as KernelBench does), then times each model on one input set (warm-up, then CUDA events per call,
   median) and reports its peak device memory (torch.cuda.max_memory_allocated), peak RSS and wall.

Input, output and parameter bytes come from `get_inputs()`, `Model(...)` and one forward under
`torch.device("meta")` (nothing allocated), in a child process, cached in OUT.sizes.json. A problem whose estimate
(4 x inputs + 2 x outputs + 2 x parameters) exceeds the free device memory is recorded as skipped, sizes named.

Results are appended to OUT as JSON lines, one per problem; problems already in OUT are skipped, so a long run is
done in chunks: `--max-minutes` stops before a problem that would not finish in time (a problem cut short by the
limit is not recorded, unless it was the first of its run; `--redo NAME` runs a recorded problem again, and its
last row counts). Problems run in level then problem-number order. The service compares with its own tolerances
(by dtype: fp32 1e-4) unless `--atol`/`--rtol` are given.

    python bench/kernelbench_full.py --out bench/results/kernelbench_full.jsonl --max-minutes 9   # GPU, repeat
    python bench/kernelbench_full.py --summarize bench/results/kernelbench_full.jsonl
    python bench/kernelbench_full.py --device cpu --levels 1 --smallest 3 --timing-trials 5 --out /tmp/kb.jsonl

Sizes are never changed: `--smallest N` only picks the N problems with the fewest bytes (inputs + outputs +
parameters), for a smoke test on the CPU. docs/evaluator-gpu.md ("Whole-KernelBench run") has the commands.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KERNELBENCH_TOL = 1e-2
GIB = 1 << 30
# Targets of the issue this benchmark answers.
TARGET_SPEEDUP_BAND = 0.05
TARGET_WALL_RATIO = 1.5
TEARDOWN_RESERVE_S = 25.0
META_FORWARD_LIMIT_S = 3.0
GPU_DEFAULTS = {"memory_limit_mb": 65536, "max_file_mb": 20480}
CPU_DEFAULTS = {"memory_limit_mb": 16384, "max_file_mb": 8192}


# ---- candidate source ----------------------------------------------------------------------------------------------


def rename_model(source: str) -> tuple[str, int]:
    """`source` with every name token `Model` (not strings or comments) renamed to `ModelNew`; and how many."""
    lines = source.splitlines(keepends=True)
    hits = [
        tok.start
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.NAME and tok.string == "Model"
    ]
    for row, col in sorted(hits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + "ModelNew" + line[col + len("Model") :]
    return "".join(lines), len(hits)


def candidate_source(source: str) -> str:
    import ast

    renamed, count = rename_model(source)
    tree = ast.parse(renamed)
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    left = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "Model"]
    if "ModelNew" not in defined or left or count == 0:
        raise ValueError(f"renaming Model to ModelNew failed (renamed {count}, Model left on lines {left})")
    return renamed


# ---- children: sizes on the meta device, and the in-process check ------------------------------------------------


def _load_module(name: str, path: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # KernelBench's own, trusted problem files
    return module


def _tensor_bytes(torch: Any, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(torch, v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(torch, v) for v in value.values())
    return 0


class _Alarm(Exception):
    pass


def child_sizes(job: dict, out_path: Path) -> None:
    """Bytes of inputs, outputs and parameters of each problem, on the meta device; and the device's memory.

    The answer is rewritten after every problem, with the one being sized as `current`, so that the parent can
    name a problem that kills this process and go on without it."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    memory: dict[str, Any] = {"torch_version": torch.__version__}
    if job["device"] == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is False in this Python")
        free, total = torch.cuda.mem_get_info()
        memory |= {"free_bytes": free, "total_bytes": total, "name": torch.cuda.get_device_name()}
    else:
        import psutil

        vm = psutil.virtual_memory()
        memory |= {"free_bytes": vm.available, "total_bytes": vm.total, "name": "cpu"}

    def on_alarm(*_: object) -> None:
        raise _Alarm

    signal.signal(signal.SIGALRM, on_alarm)
    sizes: dict[str, dict] = {}
    for index, item in enumerate(job["problems"]):
        out_path.write_text(json.dumps({"memory": memory, "sizes": sizes, "current": item["key"]}))
        entry: dict[str, Any] = {"hash": item["hash"]}
        try:
            module = _load_module(f"kb_size_{index}", item["path"])
            with torch.device("meta"):
                inputs = list(module.get_inputs())
                entry["input_bytes"] = _tensor_bytes(torch, inputs)
                model = module.Model(*module.get_init_inputs())
                entry["param_bytes"] = _tensor_bytes(torch, [*model.parameters(), *model.buffers()])
                # recurrent models decompose into one meta op per step on the meta device: bounded
                signal.setitimer(signal.ITIMER_REAL, META_FORWARD_LIMIT_S)
                try:
                    with torch.no_grad():
                        entry["output_bytes"] = _tensor_bytes(torch, model(*inputs))
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except _Alarm:
            entry["error"] = f"meta forward took over {META_FORWARD_LIMIT_S} s"
        except BaseException as exc:  # noqa: BLE001 - recorded; the check and the service will say more
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        sizes[item["key"]] = entry
    out_path.write_text(json.dumps({"memory": memory, "sizes": sizes, "current": None}))


def _flatten(torch: Any, value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _flatten(torch, item)]
    return [value]


def child_check(job: dict, result_path: Path) -> None:
    """KernelBench-style correctness and timing of one problem in this process; writes its result as it goes."""
    import resource

    t_start = time.perf_counter()
    result: dict[str, Any] = {"status": "started", "stages_s": {}}

    def save() -> None:
        result_path.write_text(json.dumps(result))

    def stage(name: str, since: float) -> float:
        now = time.perf_counter()
        result["stages_s"][name] = round(now - since, 3)
        result["stage"] = name
        save()
        return now

    save()
    import torch

    t = stage("import_torch", t_start)
    device = torch.device(job["device"])
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(job["threads"])
    seed, tol = job["seed"], job["tol"]

    def seed_all(value: int) -> None:
        import random

        random.seed(value)
        torch.manual_seed(value)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(value % 2**32)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def on_device(values: list[Any]) -> list[Any]:
        return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]

    try:
        if cuda:
            torch.cuda.init()
            torch.cuda.reset_peak_memory_stats()
        reference = _load_module("kb_reference", job["reference_path"])
        candidate = _load_module("kb_candidate", job["candidate_path"])
        seed_all(seed)
        init_inputs = on_device(list(reference.get_init_inputs()))
        seed_all(seed)
        model = reference.Model(*init_inputs).to(device)
        seed_all(seed)
        model_new = candidate.ModelNew(*init_inputs).to(device)
        sync()
        t = stage("build", t)
        inputs: list[Any] = []
        max_abs = 0.0
        with torch.no_grad():
            for trial in range(job["correctness_trials"]):
                inputs = []  # free the last trial's inputs before drawing the next
                trial_seed = seed + 1 + trial
                seed_all(trial_seed)
                with torch.device(device):
                    inputs = list(reference.get_inputs())
                result["input_bytes"] = _tensor_bytes(torch, inputs)
                seed_all(trial_seed)
                expected = _flatten(torch, model(*inputs))
                seed_all(trial_seed)
                got = _flatten(torch, model_new(*inputs))
                sync()
                if len(got) != len(expected):
                    result.update(
                        status="incorrect", trial=trial, message=f"{len(got)} outputs, {len(expected)} expected"
                    )
                    return
                for e, g in zip(expected, got, strict=True):
                    if not isinstance(e, torch.Tensor):
                        same = e == g
                    elif not isinstance(g, torch.Tensor) or g.shape != e.shape:
                        result.update(status="incorrect", trial=trial, message="output shape differs")
                        return
                    else:
                        if e.numel():
                            diff = (g.double() - e.double()).abs().nan_to_num(nan=math.inf).max().item()
                            max_abs = max(max_abs, diff)
                        same = torch.allclose(g, e, atol=tol, rtol=tol)
                    if not same:
                        result.update(status="incorrect", trial=trial, max_abs_error=max_abs)
                        return
                del expected, got
        result["max_abs_error"] = max_abs
        t = stage("correctness", t)
        timings = {}
        with torch.no_grad():
            for side, fn in (("reference", model), ("candidate", model_new)):
                for _ in range(job["warmup_trials"]):
                    fn(*inputs)
                sync()
                samples = []
                for _ in range(job["timing_trials"]):
                    if cuda:
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        fn(*inputs)
                        end.record()
                        torch.cuda.synchronize()
                        samples.append(start.elapsed_time(end))
                    else:
                        t0 = time.perf_counter()
                        fn(*inputs)
                        samples.append((time.perf_counter() - t0) * 1e3)
                timings[side] = samples
        t = stage("timing", t)
        result["status"] = "correct"
        if timings["reference"]:
            ref_ms, new_ms = statistics.median(timings["reference"]), statistics.median(timings["candidate"])
            result |= {"reference_ms": ref_ms, "candidate_ms": new_ms, "speedup": ref_ms / new_ms if new_ms else None}
    except torch.cuda.OutOfMemoryError as exc:
        result.update(status="oom", message=str(exc)[:500])
    except BaseException as exc:  # noqa: BLE001 - every failure of the problem is a result
        result.update(status="error", message=traceback.format_exc()[-1500:], error_type=type(exc).__name__)
    finally:
        if cuda:
            with contextlib.suppress(Exception):
                result["peak_device_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result["inner_s"] = round(time.perf_counter() - t_start, 3)
        save()


# ---- the driver ----------------------------------------------------------------------------------------------------


class TreeRss:
    """Peak summed RSS of a process and all its descendants, sampled in a thread every `interval_s`."""

    def __init__(self, pid: int | None, interval_s: float = 0.2, disk: Path | None = None) -> None:
        self.pid, self.interval_s, self.disk = pid, interval_s, disk
        self.peak = 0
        self.first: int | None = None
        self.disk_free_min: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def _run(self) -> None:
        while True:
            value = self.sample()
            if self.first is None:
                self.first = value
            self.peak = max(self.peak, value)
            if self.disk is not None:
                with contextlib.suppress(OSError):
                    free = shutil.disk_usage(self.disk).free
                    self.disk_free_min = free if self.disk_free_min is None else min(self.disk_free_min, free)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> TreeRss:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def key_of(problem: Any) -> str:
    return f"{problem.level}/{problem.name}"


def level_number(problem: Any) -> int:
    return int(str(problem.level).removeprefix("level"))


def read_rows(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return rows


def append_row(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def find_kernelbench(arg: str | None) -> Path:
    for candidate in (arg, os.environ.get("KERNELBENCH_PATH"), str(REPO.parent / "shared" / "kernelbench")):
        if candidate and Path(candidate).expanduser().is_dir():
            return Path(candidate).expanduser()
    raise SystemExit("no KernelBench checkout: pass --kernelbench PATH or set KERNELBENCH_PATH")


def sizes_for(problems: list[Any], device: str, cache_path: Path, workdir: Path) -> tuple[dict, dict]:
    """Meta-device sizes of `problems` (cached by source hash in `cache_path`) and the device's memory now."""
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    missing = [p for p in problems if cache.get(key_of(p), {}).get("hash") != p.hash]
    items = []
    for index, problem in enumerate(missing):
        path = workdir / f"size_{index}.py"
        path.write_text(problem.source)
        items.append({"key": key_of(problem), "hash": problem.hash, "path": str(path)})
    t0 = time.perf_counter()
    memory: dict = {}
    todo = list(items)
    while True:
        job_path, out_path = workdir / "sizes_job.json", workdir / "sizes_out.json"
        job_path.write_text(json.dumps({"device": device, "problems": todo}))
        out_path.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--_sizes", str(job_path), str(out_path)]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120 + 10 * len(todo))
            why = f"exit {run.returncode}" if run.returncode >= 0 else f"signal {-run.returncode}"
            stderr = run.stderr
        except subprocess.TimeoutExpired as exc:
            why, stderr = "sizing timed out", str(exc.stderr or "")
        answer = json.loads(out_path.read_text()) if out_path.exists() else {}
        if not answer.get("memory"):
            raise SystemExit(f"sizing child failed ({why}):\n{stderr[-3000:]}")
        memory = answer["memory"]
        cache |= answer["sizes"]
        current = answer["current"]
        if current is None:
            break
        # the child died on `current`: record that and size the rest in a fresh child
        cache[current] = {"hash": next(i["hash"] for i in todo if i["key"] == current), "error": f"sizing: {why}"}
        todo = [i for i in todo if i["key"] not in cache]
    if items:
        cache_path.write_text(json.dumps(cache, indent=0, sort_keys=True))
        print(f"sized {len(items)} problems on the meta device in {time.perf_counter() - t0:.1f} s", flush=True)
    return cache, memory


def data_bytes(size: dict) -> int:
    return sum(size.get(k) or 0 for k in ("input_bytes", "output_bytes", "param_bytes"))


def estimate_bytes(size: dict, fit_factor: float) -> int | None:
    if size.get("input_bytes") is None:
        return None
    return int(
        fit_factor * size["input_bytes"] + 2 * (size.get("output_bytes") or 0) + 2 * (size.get("param_bytes") or 0)
    )


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f} GiB"


def service_env(args: argparse.Namespace) -> dict[str, str]:
    env = {
        "EVALUATOR_MEMORY_LIMIT_MB": str(args.memory_limit_mb),
        "EVALUATOR_MAX_FILE_MB": str(args.max_file_mb),
        "EVALUATOR_WORKERS": str(args.workers),
        "EVALUATOR_DEFAULT_TIMEOUT_S": str(args.timeout_s),
        "EVALUATOR_THREADS_PER_WORKER": str(args.threads),
    }
    if args.cache_dir:
        env["EVALUATOR_CACHE_DIR"] = str(args.cache_dir)
    if args.work_dir:
        env["EVALUATOR_WORK_DIR"] = str(args.work_dir)
    if args.data_path:
        env["EVALUATOR_DATA_PATH"] = args.data_path
    return env


def service_pid(port: int) -> int | None:
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if "services.evaluator" in cmd and str(port) in cmd:
                return child.pid
    return None


def healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def run_service_measurement(args: argparse.Namespace, url: str, pid: int | None, problem: Any, budget: float) -> dict:
    import httpx

    body: dict[str, Any] = {
        "reference_source": problem.source,
        "candidate_source": candidate_source(problem.source),
        "device": args.device,
        "correctness_trials": args.correctness_trials,
        "timing_trials": args.timing_trials,
        "warmup_trials": args.warmup_trials,
        "seed": args.seed,
    }
    if args.atol is not None:
        body["atol"] = args.atol
    if args.rtol is not None:
        body["rtol"] = args.rtol
    cut = budget < args.timeout_s
    if cut:
        body["timeout_s"] = max(1.0, budget)
    client_timeout = budget if cut else 3 * args.timeout_s + 300
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    with TreeRss(pid, disk=args.work_dir or Path(tempfile.gettempdir())) as rss:
        try:
            response = httpx.post(f"{url}/evaluate", json=body, timeout=client_timeout)
            out["wall_s"] = round(time.perf_counter() - t0, 3)
            if response.status_code != 200:
                out |= {"status": f"http_{response.status_code}", "message_head": response.text[:300]}
            else:
                r = response.json()
                out |= {
                    "status": r["status"],
                    "speedup": r.get("speedup"),
                    "reference_ms": (r.get("reference_ms") or {}).get("median"),
                    "candidate_ms": (r.get("candidate_ms") or {}).get("median"),
                    "max_abs_error": r.get("max_abs_error"),
                    "flags": r.get("flags", []),
                    "message_head": (r.get("message") or "")[:300],
                    # A traceback's last lines say what failed; its head says only where.
                    "message_tail": (r.get("message") or "")[300:][-700:],
                    "phases_s": r.get("phases_s", {}),
                    "duration_s": r.get("duration_s"),
                    "device": r.get("device"),
                }
                if cut and out["wall_s"] >= 0.9 * budget:
                    out["cut_by_deadline"] = True
        except httpx.TimeoutException:
            out |= {"status": "client_timeout", "wall_s": round(time.perf_counter() - t0, 3), "cut_by_deadline": cut}
        except httpx.HTTPError as exc:
            out |= {"status": "http_error", "wall_s": round(time.perf_counter() - t0, 3), "message_head": repr(exc)}
    # the workers' files (inputs, outputs of every trial) go to the work dir: its lowest free space, for failures
    out |= {"peak_rss_bytes": rss.peak, "rss_before_bytes": rss.first, "work_dir_free_min_bytes": rss.disk_free_min}
    return out


def run_check(args: argparse.Namespace, problem: Any, workdir: Path, budget: float) -> dict:
    ref_path, cand_path = workdir / "kb_reference.py", workdir / "kb_candidate.py"
    ref_path.write_text(problem.source)
    cand_path.write_text(candidate_source(problem.source))
    job = {
        "device": args.device,
        "reference_path": str(ref_path),
        "candidate_path": str(cand_path),
        "seed": args.seed,
        "tol": KERNELBENCH_TOL,
        "threads": args.threads,
        "correctness_trials": args.correctness_trials,
        "timing_trials": args.timing_trials,
        "warmup_trials": args.warmup_trials,
    }
    job_path, result_path, log_path = workdir / "check_job.json", workdir / "check_result.json", workdir / "check.log"
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    limit = min(args.check_timeout_s, budget)
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--_check", str(job_path), str(result_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with TreeRss(proc.pid) as rss:
            try:
                returncode: int | None = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                returncode = None
    out: dict[str, Any] = {"wall_s": round(time.perf_counter() - t0, 3), "tree_peak_rss_bytes": rss.peak}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        out |= json.loads(result_path.read_text())
    out["returncode"] = returncode
    tail = log_path.read_bytes()[-1500:].decode(errors="replace")
    if returncode is None:
        out |= {"status": "timeout", "message": f"killed after {limit:.0f} s in stage {out.get('stage')}"}
        out["cut_by_deadline"] = limit < args.check_timeout_s
    elif out.get("status") in (None, "started"):
        why = f"signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        out |= {"status": "crashed", "message": f"{why} after stage {out.get('stage')}: {tail}"}
    if "message" in out:
        out["message_head"] = str(out.pop("message"))[:300]
    return out


def predicted_s(rows: list[dict], size: dict) -> float:
    """A guess of a problem's service + check wall, from finished problems with about as many bytes."""
    walls = [
        (
            data_bytes(r.get("sizes") or {}),
            (r.get("service") or {}).get("wall_s", 0) + (r.get("check") or {}).get("wall_s", 0),
        )
        for r in rows
        if r.get("kind") == "problem" and not r.get("skipped")
    ]
    if not walls:
        return 0.0
    mine = data_bytes(size)
    near = [w for b, w in walls if mine / 2 <= b <= max(2 * mine, 1)]
    return max(near) if near else statistics.median(w for _, w in walls)


@contextlib.contextmanager
def started_service(args: argparse.Namespace, log_path: Path) -> Iterator[tuple[str, int | None, float]]:
    from tests.servers import run_service

    t0 = time.perf_counter()
    with run_service("evaluator", env=service_env(args), log_path=log_path, timeout_s=300) as url:
        pid = service_pid(int(url.rsplit(":", 1)[1]))
        import httpx

        devices = httpx.get(f"{url}/health", timeout=10).json().get("details", {}).get("devices", [])
        if args.device not in devices:
            raise SystemExit(f"the evaluator sees devices {devices}, not {args.device}")
        yield url, pid, time.perf_counter() - t0


def progress_line(index: int, total: int, row: dict) -> str:
    head = f"[{index}/{total}] {row['key']:60.60s} in {gib((row.get('sizes') or {}).get('input_bytes')):>10s}"
    if row.get("skipped"):
        return f"{head}  skipped: {row['skipped']}"
    s, c = row["service"], row["check"]

    def side(d: dict) -> str:
        speed = f"x{d['speedup']:.3f}" if d.get("speedup") else ""
        return f"{d.get('status')} {speed} ({d.get('wall_s', 0):.1f} s)"

    return (
        f"{head}  service {side(s)} rss {gib(s.get('peak_rss_bytes'))}  |  check {side(c)} "
        f"dev {gib(c.get('peak_device_bytes'))}"
        + (f"  flags {s['flags']}" if s.get("flags") else "")
        + ("  (cut short by --max-minutes; --redo to run it again)" if row.get("cut_by_deadline") else "")
    )


def run(args: argparse.Namespace) -> None:
    from problems import load_kernelbench

    t_run = time.perf_counter()
    deadline = t_run + args.max_minutes * 60 if args.max_minutes else math.inf
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    problems = load_kernelbench(find_kernelbench(args.kernelbench), levels=tuple(args.levels))
    if args.problems:
        problems = [p for p in problems if any(s in key_of(p) for s in args.problems)]
    rows = read_rows(out)
    done = {
        r["key"]
        for r in rows
        if r.get("kind") == "problem" and not (args.redo and any(x in r["key"] for x in args.redo))
    }
    with tempfile.TemporaryDirectory(prefix="kernelbench_full_") as tmp:
        workdir = Path(tmp)
        sized = problems if args.smallest else [p for p in problems if key_of(p) not in done]
        sizes, memory = sizes_for(sized, args.device, Path(f"{out}.sizes.json"), workdir)
        if args.smallest:
            # problems whose inputs could not be sized are not small: last
            def order(p: Any) -> tuple[bool, int]:
                size = sizes.get(key_of(p), {})
                return size.get("input_bytes") is None, data_bytes(size)

            problems = sorted(problems, key=order)[: args.smallest]
        pending = [p for p in problems if key_of(p) not in done]
        print(
            f"{len(problems)} problems selected, {len(problems) - len(pending)} already in {out}, {len(pending)} to run; "
            f"{args.device} {memory.get('name')}: {gib(memory.get('free_bytes'))} free of {gib(memory.get('total_bytes'))}",
            flush=True,
        )
        total, index, stopped, first = len(pending), 0, "", True

        def over_time() -> str:
            """Why the next problem must wait for the next run, or ''."""
            budget = deadline - time.perf_counter() - TEARDOWN_RESERVE_S
            guess = predicted_s(rows, sizes.get(key_of(pending[0]), {}))
            if budget < max(10.0, guess):
                return f"--max-minutes: {budget:.0f} s left, the next problem needs about {guess:.0f} s"
            return ""

        while pending and not (stopped := over_time()):
            with started_service(args, Path(f"{out}.service.log")) as (url, pid, startup_s):
                print(f"evaluator up in {startup_s:.1f} s at {url} (pid {pid})", flush=True)
                session = {"kind": "session", "started_s": round(startup_s, 2), "problems": 0, "device": memory}
                while pending and not (stopped := over_time()):
                    problem = pending[0]
                    budget = deadline - time.perf_counter() - TEARDOWN_RESERVE_S
                    row = measure(args, url, pid, problem, sizes.get(key_of(problem), {}), memory, workdir, budget)
                    cut = (row.get("service") or {}).get("cut_by_deadline") or (row.get("check") or {}).get(
                        "cut_by_deadline"
                    )
                    if cut and not first:
                        stopped = f"--max-minutes: {key_of(problem)} was cut short; it runs first next time"
                        break
                    first = False
                    index += 1
                    append_row(out, row)
                    rows.append(row)
                    pending.pop(0)
                    session["problems"] += 1
                    print(progress_line(index, total, row), flush=True)
                    if not row.get("skipped") and not healthy(url):
                        print("the evaluator stopped answering; starting it again", flush=True)
                        break
                if session["problems"]:
                    append_row(out, session | {"wall_s": round(time.perf_counter() - t_run, 2)})
        if stopped:
            print(f"stopped: {stopped}; {len(pending)} problems left, run the same command again", flush=True)
    print(f"run wall {time.perf_counter() - t_run:.1f} s\n", flush=True)
    print(summarize(read_rows(out)))


def measure(
    args: argparse.Namespace,
    url: str,
    pid: int | None,
    problem: Any,
    size: dict,
    memory: dict,
    workdir: Path,
    budget: float,
) -> dict:
    row: dict[str, Any] = {
        "kind": "problem",
        "key": key_of(problem),
        "level": level_number(problem),
        "name": problem.name,
        "hash": problem.hash,
        "device": args.device,
        "sizes": {k: size.get(k) for k in ("input_bytes", "output_bytes", "param_bytes", "error") if k in size},
        "settings": {
            **{
                k: getattr(args, k)
                for k in ("correctness_trials", "timing_trials", "warmup_trials", "seed", "atol", "rtol")
            },
            "data_path": args.data_path or ("drawn" if args.device == "cuda" else "files"),
        },
        "skipped": None,
    }
    need = estimate_bytes(size, args.fit_factor)
    row["estimate_bytes"] = need
    if need is not None and memory.get("free_bytes") and need > memory["free_bytes"]:
        row["skipped"] = (
            f"does not fit: inputs {gib(size.get('input_bytes'))}, outputs {gib(size.get('output_bytes'))}, "
            f"parameters {gib(size.get('param_bytes'))}; estimate {gib(need)} ({args.fit_factor:g} x inputs + 2 x "
            f"outputs + 2 x parameters) > {gib(memory['free_bytes'])} free of {gib(memory.get('total_bytes'))}"
        )
        return row
    try:
        candidate_source(problem.source)
    except (ValueError, SyntaxError) as exc:
        row["skipped"] = f"no candidate: {exc}"
        return row
    row["service"] = run_service_measurement(args, url, pid, problem, budget)
    left = max(1.0, budget - row["service"].get("wall_s", 0))
    row["check"] = run_check(args, problem, workdir, left)
    if row["service"].get("cut_by_deadline") or row["check"].get("cut_by_deadline"):
        row["cut_by_deadline"] = True  # the first problem of a run, recorded although --max-minutes cut it
    row["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    return row


# ---- summary -------------------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _table(headers: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def summarize(rows: list[dict]) -> str:
    latest = {r["key"]: r for r in rows if r.get("kind") == "problem"}  # a problem run again: its last row
    problems = sorted(latest.values(), key=lambda r: r["level"])
    sessions = [r for r in rows if r.get("kind") == "session"]
    if not problems:
        return "no problems recorded yet"
    groups = [
        (f"level {lv}", [r for r in problems if r["level"] == lv]) for lv in sorted({r["level"] for r in problems})
    ]
    groups.append(("total", problems))
    verdicts = sorted({r["service"]["status"] for r in problems if not r.get("skipped")})
    checks = sorted({r["check"]["status"] for r in problems if not r.get("skipped")})
    counts, timing = [], []
    for name, group in groups:
        ran = [r for r in group if not r.get("skipped")]
        counts.append(
            [name, str(len(group)), str(len(group) - len(ran))]
            + [str(sum(r["service"]["status"] == v for r in ran)) for v in verdicts]
            + [" ".join(f"{c}:{sum(r['check']['status'] == c for r in ran)}" for c in checks)]
        )
        svc_speed = [
            r["service"]["speedup"] for r in ran if r["service"]["status"] == "correct" and r["service"].get("speedup")
        ]
        chk_speed = [
            r["check"]["speedup"] for r in ran if r["check"]["status"] == "correct" and r["check"].get("speedup")
        ]
        both = [r for r in ran if r["service"].get("wall_s") is not None and r["check"].get("wall_s") is not None]
        svc_wall = sum(r["service"]["wall_s"] for r in both)
        chk_wall = sum(r["check"]["wall_s"] for r in both)
        timing.append(
            [
                name,
                _fmt(_median(svc_speed)),
                _fmt(_median(chk_speed)),
                f"{svc_wall:.1f}",
                f"{chk_wall:.1f}",
                _fmt(svc_wall / chk_wall if chk_wall else None, ".2f"),
                gib(max((r["service"].get("peak_rss_bytes") or 0 for r in ran), default=None)),
                gib(max((r["check"].get("tree_peak_rss_bytes") or 0 for r in ran), default=None)),
                gib(
                    max(
                        (r["check"]["peak_device_bytes"] for r in ran if r["check"].get("peak_device_bytes")),
                        default=None,
                    )
                ),
            ]
        )
    out = [
        "### Verdicts (service), skipped problems, and the in-process check's statuses",
        "",
        _table(["", "problems", "skipped", *verdicts, "in-process check"], counts),
        "",
        "### Speedup, wall and memory",
        "",
        _table(
            [
                "",
                "median speedup, service (correct)",
                "median speedup, in-process (correct)",
                "service wall (s)",
                "in-process wall (s)",
                "ratio",
                "peak host RSS, service tree",
                "peak host RSS, in-process",
                "peak device memory, in-process",
            ],
            timing,
        ),
    ]
    ran = [r for r in problems if not r.get("skipped")]
    correct = [r for r in ran if r["service"]["status"] == "correct"]
    med = _median([r["service"]["speedup"] for r in correct if r["service"].get("speedup")])
    errors = [r for r in ran if r["service"]["status"] == "evaluator_error"]
    svc_wall = sum(r["service"].get("wall_s") or 0 for r in ran)
    chk_wall = sum(r["check"].get("wall_s") or 0 for r in ran)
    start_s = sum(s.get("started_s", 0) for s in sessions)
    ratio = svc_wall / chk_wall if chk_wall else None

    def mark(ok: bool) -> str:
        return "yes" if ok else "**no**"

    out += [
        "",
        "### Targets",
        "",
        _table(
            ["target", "measured", "met?"],
            [
                [
                    "every problem that fits is `correct`",
                    f"{len(correct)} of {len(ran)}",
                    mark(len(correct) == len(ran)),
                ],
                [
                    "median speedup of correct ones within 5 % of 1.0",
                    _fmt(med),
                    mark(med is not None and abs(med - 1) <= TARGET_SPEEDUP_BAND),
                ],
                ["no `evaluator_error`", str(len(errors)), mark(not errors)],
                [
                    f"whole wall at most {TARGET_WALL_RATIO}x the in-process check's",
                    f"{svc_wall:.0f} s vs {chk_wall:.0f} s: {_fmt(ratio, '.2f')}x "
                    f"({start_s:.0f} s of service start-ups in {len(sessions)} runs not included)",
                    mark(ratio is not None and ratio <= TARGET_WALL_RATIO),
                ],
            ],
        ),
    ]
    others = [r for r in ran if r["service"]["status"] != "correct" or r["check"]["status"] != "correct"]
    if others:
        out += ["", "### Not correct (service or in-process)", ""]
        out.append(
            _table(
                ["problem", "service", "in-process", "service message (head)"],
                [
                    [
                        r["key"],
                        r["service"]["status"] + (f" {r['service']['flags']}" if r["service"].get("flags") else ""),
                        r["check"]["status"],
                        " ".join((r["service"].get("message_head") or r["check"].get("message_head") or "").split())[
                            :160
                        ].replace("|", "/"),
                    ]
                    for r in others
                ],
            )
        )
    skipped = [r for r in problems if r.get("skipped")]
    if skipped:
        out += ["", "### Skipped", ""]
        out.append(_table(["problem", "why"], [[r["key"], r["skipped"]] for r in skipped]))
    return "\n".join(out)


# ---- command line --------------------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] in ("--_sizes", "--_check"):
        job = json.loads(Path(sys.argv[2]).read_text())
        if sys.argv[1] == "--_sizes":
            child_sizes(job, Path(sys.argv[3]))
        else:
            child_check(job, Path(sys.argv[3]))
        return
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kernelbench_full.jsonl")
    ap.add_argument("--summarize", type=Path, metavar="OUT.jsonl", help="print the tables of a results file and exit")
    ap.add_argument(
        "--kernelbench", help="KernelBench checkout (default: $KERNELBENCH_PATH, else ../shared/kernelbench)"
    )
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--problems", nargs="+", help="only problems whose level/name contains one of these")
    ap.add_argument("--redo", nargs="+", help="run these (level/name substrings) again although OUT has them")
    ap.add_argument("--smallest", type=int, help="only the N problems with the fewest bytes (sizes unchanged)")
    ap.add_argument("--max-minutes", type=float, help="stop cleanly before this much wall time has passed")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--correctness-trials", type=int, default=5)
    ap.add_argument("--timing-trials", type=int, default=100)
    ap.add_argument("--warmup-trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--atol", type=float, help="service tolerance (default: the service's, by dtype)")
    ap.add_argument("--rtol", type=float, help="service tolerance (default: the service's, by dtype)")
    ap.add_argument(
        "--fit-factor", type=float, default=4.0, help="device bytes needed per input byte (+ outputs, params)"
    )
    ap.add_argument("--check-timeout-s", type=float, default=900.0, help="limit of one in-process check")
    ap.add_argument("--threads", type=int, default=max(1, cpus // 2), help="torch threads (service workers and check)")
    svc = ap.add_argument_group("evaluator service (EVALUATOR_* of the started service)")
    svc.add_argument("--memory-limit-mb", type=int, help="default 65536 on cuda, 16384 on cpu")
    svc.add_argument("--max-file-mb", type=int, help="default 20480 on cuda, 8192 on cpu")
    svc.add_argument("--workers", type=int, default=2)
    svc.add_argument("--cache-dir", type=Path, help="build cache (default: the service's, ~/.cache/kernel-agent)")
    svc.add_argument("--work-dir", type=Path, help="where workers keep inputs and outputs (default: system temp)")
    svc.add_argument("--timeout-s", type=float, default=900.0, help="EVALUATOR_DEFAULT_TIMEOUT_S")
    svc.add_argument(
        "--data-path", choices=("drawn", "files"), help="EVALUATOR_DATA_PATH (default: the service's, drawn on cuda)"
    )
    args = ap.parse_args()
    if args.summarize:
        print(summarize(read_rows(args.summarize)))
        return
    defaults = GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    run(args)


if __name__ == "__main__":
    main()
