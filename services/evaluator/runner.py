"""The two jobs a worker runs: the reference (inputs and expected outputs) and the candidate (outputs, timing).

Runs inside the sandboxed worker process only; see the threat model in `worker.py`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import torch
import torch.utils.cpp_extension  # noqa: F401 - imported before candidate code, so build_cache can wrap it

from services.evaluator import build_cache, gpu_checks, pch
from services.evaluator.backends import KernelBackend, get_backend, triton_support
from services.evaluator.guards import Guard

# Bound before any candidate code runs: these are what the outputs are written and read with.
_save = torch.save
_load = torch.load


@dataclass
class WorkerContext:
    backend: KernelBackend
    home: Path
    cache_dir: Path
    threads: int
    emit: Callable[..., None]

    @classmethod
    def start(cls, device: str, threads: int, cache_dir: str, emit: Callable[..., None]) -> WorkerContext:
        torch.set_num_threads(threads)
        backend = get_backend(device)
        if not backend.available():
            raise RuntimeError(f"device {device!r} is not available in this worker")
        if backend.name == "cuda":
            # Build for this GPU's arch only (read from the device) unless the candidate names its own.
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", pch.device_arch(0))
            backend.activate()
        # Trusted patches of torch by torch itself happen before the guard's snapshot, so that a torch.compile or
        # Triton candidate is not flagged for them: importing torch._dynamo wraps torch.manual_seed, and dynamo's
        # first compile replaces nn.Module.__init__/__setstate__ (generation tagging), which we install up front.
        dynamo = importlib.import_module("torch._dynamo")
        dynamo.mutation_guard.install_generation_tagging_init()
        if backend.name == "cuda" and triton_support.available():
            importlib.import_module("triton.language")
        return cls(backend, Path.cwd(), Path(cache_dir), threads, emit)

    @contextlib.contextmanager
    def exclusive_device(self) -> Iterator[None]:
        """Hold the GPU alone while running models (builds of other workers go on meanwhile); reports the wait."""
        exclusive = getattr(self.backend, "exclusive", None)
        if exclusive is None:
            yield
            return
        asked = time.monotonic()
        with exclusive(self.cache_dir / "locks"):
            self.emit("device_acquired", wait_s=time.monotonic() - asked)
            yield


def run_job(context: WorkerContext, job: dict[str, Any], control: IO[str]) -> None:
    if job["role"] == "reference":
        run_reference(context, job)
    else:
        run_candidate(context, job, control)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


def load_source(name: str, source: str, path: Path) -> ModuleType:
    """Import `source` from a real file, so that inspect (and Triton's jit) can read it back."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def to_plain(value: Any) -> Any:
    """Detached CPU copy of outputs/inputs with tensor subclasses stripped, so only plain data is saved."""
    if isinstance(value, torch.Tensor):
        return torch.Tensor.as_subclass(value.detach(), torch.Tensor).to("cpu", copy=True)
    if isinstance(value, list | tuple):
        return [to_plain(item) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    raise TypeError(f"model returned a {type(value).__name__}; expected tensors, numbers or tuples of them")


def clone_inputs(values: Sequence[Any]) -> list[Any]:
    return [value.clone() if isinstance(value, torch.Tensor) else value for value in values]


def run_reference(context: WorkerContext, job: dict[str, Any]) -> None:
    """Draw inputs per trial and save them with the reference's outputs; the service keeps the outputs."""
    backend, seed = context.backend, job["seed"]
    module = load_source("kernel_reference", job["reference_source"], context.home / "reference.py")
    seed_everything(seed)
    init_inputs = list(module.get_init_inputs())
    seed_everything(seed)
    model = module.Model(*init_inputs).to(backend.device_string())
    _save(to_plain(init_inputs), context.home / "init.pt")
    with torch.no_grad(), context.exclusive_device():
        for trial in range(job["trials"]):
            seed_everything(seed + 1 + trial)
            inputs = _draw_inputs(backend, module, model, seed + 1 + trial, signed=trial % 2 == 1)
            _save(to_plain(inputs), context.home / f"inputs_{trial}.pt")
            outputs = model(*backend.prepare_inputs(clone_inputs(inputs)))
            backend.synchronize()
            _save(to_plain(outputs), context.home / f"expected_{trial}.pt")
    context.emit("result", device=backend.describe(), torch_version=torch.__version__)


def _draw_inputs(backend: KernelBackend, module: ModuleType, model: Any, seed: int, signed: bool) -> list[Any]:
    """CPU: `get_inputs()` as written. CUDA: drawn on the device, and every other trial signed (see gpu_checks)."""
    if backend.name != "cuda":
        return list(module.get_inputs())
    if signed:
        return gpu_checks.signed_if_finite(model, module.get_inputs, seed, backend.device_string())
    return gpu_checks.device_inputs(module.get_inputs, seed, backend.device_string(), signed=False)


def _build_candidate(context: WorkerContext, job: dict[str, Any], init_inputs: list[Any]) -> torch.nn.Module | None:
    try:
        module = load_source("kernel_candidate", job["candidate_source"], context.home / "candidate.py")
        seed_everything(job["seed"])
        return module.ModelNew(*init_inputs).to(context.backend.device_string())
    except BaseException:
        context.emit("error", stage="compile", message=traceback.format_exc(chain=False))
        return None


def _load_inputs(path: Path) -> list[Any]:
    """One trial's inputs, memory-mapped copy-on-write: pages are read as the device copy or the model touches them,
    and a candidate writing into its inputs changes only this process's pages, never the file."""
    return _load(path, weights_only=True, mmap=True)


def _write_outputs(context: WorkerContext, model: torch.nn.Module, input_paths: list[Path]) -> bool:
    """Run every correctness trial and save its outputs; one trial's inputs are in memory at a time, so GPU-sized
    problems fit the worker's memory limit."""
    out_dir = context.home / "out"
    out_dir.mkdir()
    try:
        with torch.no_grad():
            for trial, path in enumerate(input_paths):
                args = context.backend.prepare_inputs(_load_inputs(path))
                outputs = model(*args)
                context.backend.synchronize()
                _save({"outputs": to_plain(outputs), "inputs_after": to_plain(args)}, out_dir / f"{trial}.pt")
    except BaseException:
        context.emit("error", stage="run", message=traceback.format_exc())
        return False
    return True


def run_candidate(context: WorkerContext, job: dict[str, Any], control: IO[str]) -> None:
    """Build ModelNew, write its outputs for the service to compare, then (if told to) time it against Model."""
    guard = Guard()
    loader = build_cache.install(context.cache_dir, context.home / "build", context.backend.name, context.emit)
    inputs_dir = context.home / "inputs"
    init_inputs = _load(inputs_dir / "init.pt", weights_only=True)
    input_paths = [inputs_dir / f"inputs_{t}.pt" for t in range(job["trials"])]
    model = _build_candidate(context, job, init_inputs)
    if model is None:
        return
    context.emit("compiled", cache_hit=loader.hits > 0 and loader.builds == 0)
    with context.exclusive_device():
        if not _write_outputs(context, model, input_paths):
            return
    context.emit("outputs_written", replaced=guard.replaced())
    command = control.readline()
    if not command.strip() or not json.loads(command).get("time"):
        context.emit("result", replaced=guard.replaced())
        return
    try:
        with context.exclusive_device():
            timing = time_against_reference(context, job, model, init_inputs, _load_inputs(input_paths[0]))
    except BaseException:
        context.emit("error", stage="timing", message=traceback.format_exc())
        return
    context.emit("result", replaced=guard.replaced(), **timing)


def _repeat(fn: Callable[..., Any], reps: int) -> Callable[..., Any]:
    def repeated(*args: Any) -> None:
        for _ in range(reps):
            fn(*args)

    return repeated


def _calibrate(backend: KernelBackend, fn: Callable[..., Any], args: Sequence[Any], min_sample_ms: float) -> int:
    """Calls per sample, so that one sample lasts at least `min_sample_ms` (perf_counter noise stays small)."""
    single_ms = statistics.median(backend.time_calls(fn, args, 3))
    return max(1, min(10_000, math.ceil(min_sample_ms / max(single_ms, 1e-4))))


def time_against_reference(
    context: WorkerContext, job: dict[str, Any], model: torch.nn.Module, init_inputs: list[Any], inputs: list[Any]
) -> dict[str, Any]:
    """Warm up, then time reference and candidate sample by sample, alternating, on the same inputs."""
    backend = context.backend
    reference = load_source("kernel_reference", job["reference_source"], context.home / "reference.py")
    seed_everything(job["seed"])
    ref_model = reference.Model(*init_inputs).to(backend.device_string())
    if backend.name == "cuda":
        return gpu_checks.time_and_check(
            backend,
            ref_model,
            model,
            reference.get_inputs,
            job,
            job["candidate_source"],
            job.get("bound_fraction", 0.5),
        )
    torch.set_num_threads(context.threads)
    ref_args = backend.prepare_inputs(clone_inputs(inputs))
    cand_args = backend.prepare_inputs(clone_inputs(inputs))
    samples: dict[str, list[float]] = {"reference": [], "candidate": []}
    reps: dict[str, int] = {}
    with torch.no_grad():
        for _ in range(job["warmup_trials"]):
            ref_model(*ref_args)
            model(*cand_args)
        backend.synchronize()
        calls = {"reference": (ref_model, ref_args), "candidate": (model, cand_args)}
        for role, (fn, args) in calls.items():
            reps[role] = _calibrate(backend, fn, args, job["min_sample_ms"])
        repeated = {role: _repeat(fn, reps[role]) for role, (fn, _) in calls.items()}
        for trial in range(job["timing_trials"]):
            # Sample by sample, alternating which goes first, so load changes hit both alike.
            for role in ("reference", "candidate") if trial % 2 == 0 else ("candidate", "reference"):
                (ms,) = backend.time_calls(repeated[role], calls[role][1], 1)
                samples[role].append(ms / reps[role])
    return {
        "reference_samples": samples["reference"],
        "candidate_samples": samples["candidate"],
        "reference_reps": reps["reference"],
        "candidate_reps": reps["candidate"],
        "device": backend.describe(),
    }
