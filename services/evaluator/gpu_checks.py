"""Checks that only make sense on a GPU; each returns facts, the judge (evaluation.py) turns them into flags.

What each defeats:
- `device_inputs(signed=True)`: KernelBench draws `torch.rand` inputs in [0, 1), so `return x` passes for ReLU;
  a signed draw spans [-max, max).
- `poison_freed_blocks`: an uninitialised `torch.empty` output reuses a freed block of the same size from the
  caching allocator, e.g. the reference's output of the previous timed call; we fill such blocks with NaN first.
- `own_kernel_names` + `launched_kernel_names`: a candidate that declares kernels but runs only torch's.
- `beyond_physical_bound`: faster than reading every input once from device memory at the bandwidth the
  reference's process measured.
"""

from __future__ import annotations

import ast
import math
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

try:
    import torch
except ImportError:  # importable without torch; the checks themselves run only in CUDA workers
    torch = None  # type: ignore[assignment]


BANDWIDTH_PROBE_BYTES = 512 * 2**20
# Below this floor (ms) launch latency dominates and the bound says nothing.
MIN_MEANINGFUL_FLOOR_MS = 0.01

_GLOBAL_RE = re.compile(r"__global__\s+(?:[\w:<>,\s]*?\s)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
_TRITON_DECORATORS = {"jit", "autotune", "heuristics"}


# Every tensor a draw has returned (as_returned), while it lives: a `get_inputs` that keeps a tensor between calls (a
# cache) returns it again, and mapping that one in place would change what every later draw returns. (Each worker's
# first draw is a correctness trial's, unsigned, so a kept tensor is known before any signed draw.)
_returned: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def make_signed(inputs: Sequence[Any]) -> list[Any]:
    """Map every non-negative floating tensor from [0, m) onto [-m, m); signed tensors are kept. A tensor drawn just
    now (not a view, not one returned before, contiguous, not requiring grad) is mapped in place: inputs can be most of
    the GPU's memory, and a copy beside the drawn tensor and a block's buffers ran the largest KernelBench problems
    out of it on an H100."""
    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            # Reductions, not a mask of the tensor's size.
            lowest, top = (float(v) for v in torch.aminmax(t.detach()))
            if lowest >= 0:  # False where any value is NaN, as `(t >= 0).all()` is
                # Contiguous: a tensor whose elements share memory (stride 0) cannot be written in place.
                alone = t._base is None and t.is_contiguous() and not t.requires_grad
                t = (t.mul_(2) if alone and _returned.get(id(t)) is not t else torch.mul(t, 2)).sub_(top or 1.0)
        out.append(t)
    return out


def device_inputs(get_inputs: Callable[[], Sequence[Any]], seed: int, device: Any, signed: bool) -> list[Any]:
    """Inputs drawn directly on the device (no host copy of GPU-sized tensors), reproducible from `seed`."""
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(get_inputs())
    return as_returned([t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs], signed)


def as_returned(inputs: list[Any], signed: bool) -> list[Any]:
    """A draw's inputs as the draw returns them: mapped where `signed` (make_signed), every tensor remembered as
    returned, so that a later draw that returns one again copies it rather than map it in place."""
    if signed:
        inputs = make_signed(inputs)
    for t in inputs:
        if isinstance(t, torch.Tensor):
            _returned[id(t)] = t
    return inputs


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
