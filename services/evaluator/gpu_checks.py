"""Hack checks that only make sense on a GPU; each returns facts, the worker turns them into flags.

What each defeats:
- `device_inputs(signed=True)`: KernelBench draws `torch.rand` inputs in [0, 1), so `return x` passes for ReLU;
  a signed draw spans [-max, max).
- `poison_freed_blocks`: an uninitialised `torch.empty` output reuses a freed block of the same size from the
  caching allocator, e.g. the reference's output of the previous timed call; we fill such blocks with NaN first.
- `refill_inplace`: output caching by `data_ptr` returns a stale answer once the same buffers hold new values.
- `unfinished_at_return`: work left on a side stream (or a lazy result) is not finished when the call returns;
  a copy taken on the current stream right away differs from the output after a device-wide synchronise.
- `own_kernel_names` + `launched_kernel_names`: a candidate that declares kernels but runs only torch's.
- `beyond_physical_bound`: faster than reading every input once from device memory at the measured bandwidth.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

try:
    import torch
except ImportError:  # importable without torch; the checks themselves run only in CUDA workers
    torch = None  # type: ignore[assignment]

FLAG_SIDE_STREAM = "side_stream"
FLAG_LAZY_OUTPUT = "lazy_output"
FLAG_BEYOND_BOUND = "beyond_physical_bound"
FLAG_NO_OWN_KERNEL = "no_custom_kernel"
FLAG_STALE_OUTPUT = "stale_output"

BANDWIDTH_PROBE_BYTES = 512 * 2**20
# Below this floor (ms) launch latency dominates and the bound says nothing.
MIN_MEANINGFUL_FLOOR_MS = 0.01

_GLOBAL_RE = re.compile(r"__global__\s+(?:[\w:<>,\s]*?\s)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
_TRITON_DECORATORS = {"jit", "autotune", "heuristics"}
# Timing input sets rotate through at most this many, and together take at most this share of free memory.
MAX_TIMING_SETS = 3
TIMING_SETS_MEMORY_SHARE = 0.2
# The re-check after timing catches stale or cached answers, not precision: it allows 10x the usual tolerance.
RECHECK_TOLERANCE_FACTOR = 10.0


def make_signed(inputs: Sequence[Any]) -> list[Any]:
    """Map every non-negative floating tensor from [0, m) onto [-m, m); signed tensors are kept."""
    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and bool((t >= 0).all()):
            top = float(t.max()) or 1.0
            t = t * 2 - top
        out.append(t)
    return out


def device_inputs(get_inputs: Callable[[], Sequence[Any]], seed: int, device: Any, signed: bool) -> list[Any]:
    """Inputs drawn directly on the device (no host copy of GPU-sized tensors), reproducible from `seed`."""
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(get_inputs())
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    return make_signed(inputs) if signed else inputs


def refill_inplace(inputs: Sequence[Any], fresh: Sequence[Any]) -> None:
    """Copy new values into the existing input buffers: same data_ptr, different data."""
    for old, new in zip(inputs, fresh, strict=True):
        if isinstance(old, torch.Tensor):
            old.copy_(new)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def poison_freed_blocks(like: Sequence[Any], device: Any) -> None:
    """Fill allocator blocks of the outputs' sizes with NaN (or the dtype's max) and free them again.

    The caching allocator hands a freed block of the right size to the next allocation of that size, so an
    output the candidate never writes now reads as NaN instead of the reference's old answer.
    """
    with torch.no_grad():
        for t in like:
            if not isinstance(t, torch.Tensor):
                continue
            fill = (
                math.nan
                if t.is_floating_point() or t.is_complex()
                else (True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
            )
            block = torch.full(t.shape, fill, dtype=t.dtype, device=device)
            del block
    torch.cuda.synchronize(device)


def is_plain_output(out: Any) -> bool:
    """Exactly torch.Tensor objects (no subclasses or proxies that compute when compared)."""
    return all(type(t) is torch.Tensor for t in _as_list(out))


def unfinished_at_return(fn: Callable[..., Any], args: Sequence[Any], device: Any) -> tuple[Any, bool]:
    """Call once; True if the output still changed after the call returned (side stream or lazy work)."""
    torch.cuda.synchronize(device)
    out = fn(*args)
    snapshots = [t.clone() if isinstance(t, torch.Tensor) else None for t in _as_list(out)]
    torch.cuda.synchronize(device)
    changed = any(
        snap is not None and not torch.equal(snap.nan_to_num(0.0, 0.0, 0.0), t.nan_to_num(0.0, 0.0, 0.0))
        if snap is not None and snap.is_floating_point()
        else (snap is not None and not torch.equal(snap, t))
        for snap, t in zip(snapshots, _as_list(out), strict=True)
    )
    return out, changed


def own_kernel_names(source: str) -> set[str]:
    """Names of the kernels the candidate defines: CUDA `__global__` functions and Triton-decorated functions."""
    names = set(_GLOBAL_RE.findall(source))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                attr = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if attr in _TRITON_DECORATORS:
                    names.add(node.name)
    return names


def launched_kernel_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[str]:
    """Names of the GPU kernels one call launches, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sorted({evt.name for evt in prof.events() if evt.device_type == torch.autograd.DeviceType.CUDA})


def launches_own_kernel(launched: Sequence[str], own: set[str]) -> bool:
    return any(name in kernel for kernel in launched for name in own)


def measure_bandwidth_gbs(device: Any, nbytes: int = BANDWIDTH_PROBE_BYTES, reps: int = 5) -> float:
    """Device-memory bandwidth in GB/s from a device-to-device copy, counting bytes read plus written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(reps):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    del src, dst
    return 2 * nbytes / (best * 1e-3) / 1e9


def input_bytes(inputs: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))


def physical_floor_ms(inputs: Sequence[Any], bandwidth_gbs: float) -> float:
    """Time to read every input once at the measured bandwidth."""
    return input_bytes(inputs) / (bandwidth_gbs * 1e9) * 1e3


def beyond_physical_bound(candidate_ms: float, floor_ms: float, fraction: float) -> bool:
    """Faster than `fraction` of the read-the-inputs-once floor (inputs come from DRAM after the L2 flush)."""
    return floor_ms >= MIN_MEANINGFUL_FLOOR_MS and candidate_ms < fraction * floor_ms


def finite(value: Any) -> bool:
    return all(
        bool(torch.isfinite(t).all())
        for t in _as_list(value)
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
    )


def signed_if_finite(
    model: Callable[..., Any], get_inputs: Callable[[], Sequence[Any]], seed: int, device: Any
) -> list[Any]:
    """A signed draw where the reference stays finite on it (log, sqrt need their domain), else the plain one."""
    signed = device_inputs(get_inputs, seed, device, signed=True)
    with torch.no_grad():
        if finite(model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in signed])):
            return signed
    return device_inputs(get_inputs, seed, device, signed=False)


def _close(got: Any, want: Any, factor: float) -> bool:
    from services.evaluator.compare import default_tolerance

    got_l, want_l = _as_list(got), _as_list(want)
    if len(got_l) != len(want_l):
        return False
    for g, w in zip(got_l, want_l, strict=True):
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            return False
        tol = default_tolerance(w.dtype) * factor
        if not bool(torch.isclose(g.to(w.dtype), w, rtol=tol, atol=tol, equal_nan=True).all()):
            return False
    return True


def _timing_sets(get_inputs: Callable[[], Sequence[Any]], seed: int, device: Any) -> list[list[Any]]:
    first = device_inputs(get_inputs, seed, device, signed=False)
    free, _ = torch.cuda.mem_get_info(device)
    room = int(TIMING_SETS_MEMORY_SHARE * free // max(1, input_bytes(first)))
    return [first] + [
        device_inputs(get_inputs, seed + k, device, signed=False) for k in range(1, max(1, min(MAX_TIMING_SETS, room)))
    ]


def recheck_after_timing(
    ref_model: Any,
    model: Any,
    sets: Sequence[list[Any]],
    get_inputs: Callable[[], Sequence[Any]],
    seed: int,
    device: Any,
) -> bool:
    """New values in the very buffers that were timed, freed blocks poisoned; True when every answer is right."""
    with torch.no_grad():
        for k, args in enumerate(sets):
            refill_inplace(args, signed_if_finite(ref_model, get_inputs, seed + k, device))
            want = ref_model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in args])
            poison_freed_blocks(_as_list(want), device)
            got = model(*args)
            torch.cuda.synchronize(device)
            if not _close(got, want, RECHECK_TOLERANCE_FACTOR):
                return False
            del got, want
    return True


def time_and_check(
    backend: Any,
    ref_model: Any,
    model: Any,
    get_inputs: Callable[[], Sequence[Any]],
    job: dict[str, Any],
    candidate_source: str,
    bound_fraction: float,
) -> dict[str, Any]:
    """Interleaved timing of reference and candidate on rotating device inputs, plus the GPU hack checks.

    Returns the runner's `result` fields: per-call samples (reps 1), `gpu_flags` and `gpu_notes`.
    """
    from services.evaluator.backends.cuda import side_stream_suspected

    device, seed = backend.device, int(job["seed"])
    flags, notes = [], []
    sets = _timing_sets(get_inputs, seed + 1000, device)
    with torch.no_grad():
        out, unfinished = unfinished_at_return(model, sets[0], device)
        if not is_plain_output(out):
            flags.append(FLAG_LAZY_OUTPUT)
            notes.append(f"output type {type(out).__name__} is not a plain tensor")
        del out
        times = backend.time_interleaved(
            {"reference": ref_model, "candidate": model},
            sets,
            n=max(1, int(job["timing_trials"])),
            warmup=int(job["warmup_trials"]),
        )
    off_stream = side_stream_suspected(times["reference"], times["candidate"])
    if unfinished or off_stream:
        flags.append(FLAG_SIDE_STREAM)
        notes.append(
            "work still running after the call returned"
            if unfinished
            else f"host time exceeds event time by {times['candidate'].overhead_ms():.3f} ms per call"
        )
    candidate_ms = times["candidate"].wall_ms if off_stream else times["candidate"].event_ms
    bandwidth = measure_bandwidth_gbs(device)
    floor = physical_floor_ms(sets[0], bandwidth)
    median_ms = sorted(candidate_ms)[len(candidate_ms) // 2]
    if beyond_physical_bound(median_ms, floor, bound_fraction):
        flags.append(FLAG_BEYOND_BOUND)
        notes.append(
            f"{median_ms:.4f} ms is under {bound_fraction:g} x the {floor:.4f} ms it takes to read the "
            f"inputs once at {bandwidth:.0f} GB/s"
        )
    if not recheck_after_timing(ref_model, model, sets, get_inputs, seed + 2000, device):
        flags.append(FLAG_STALE_OUTPUT)
        notes.append("wrong answer when the timed input buffers were refilled with new values")
    if job.get("require_custom_kernel"):
        own = own_kernel_names(candidate_source)
        launched = launched_kernel_names(model, sets[0])
        if not launches_own_kernel(launched, own):
            flags.append(FLAG_NO_OWN_KERNEL)
            notes.append(
                f"launched only {', '.join(launched[:8]) or 'no kernels'}; own kernels: "
                f"{', '.join(sorted(own)) or 'none'}"
            )
    return {
        "reference_samples": times["reference"].event_ms,
        "candidate_samples": candidate_ms,
        "reference_reps": 1,
        "candidate_reps": 1,
        "gpu_flags": flags,
        "gpu_notes": notes,
        "bandwidth_gbs": bandwidth,
        "floor_ms": floor,
        "device": backend.describe(),
    }
