"""CUDA backend: inputs on one GPU, CUDA-event timing of one call after an L2 flush.

Every timed call: flush L2 (overwrite a buffer twice the L2 size), synchronise the device, record a start event,
call, record an end event, synchronise the device again. The event pair gives the time of the work on the current
stream. The judge times every block of calls from outside the process as well (evaluation.py): work the candidate
puts on other streams, or a report smaller than the truth, shows as time the events do not explain.

The timer functions are bound when this module is imported, before any candidate code runs, so patching
`torch.cuda.Event` or `time.perf_counter` afterwards does not change what we measure (guards.py flags the patch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from services.evaluator.backends import triton_support

try:
    import torch

    _Event = torch.cuda.Event
    _event_record = torch.cuda.Event.record
    _event_elapsed = torch.cuda.Event.elapsed_time
    _synchronize = torch.cuda.synchronize
except ImportError:  # the CPU-only service image may lack torch's CUDA bits; available() says False then
    torch = None  # type: ignore[assignment]

FLUSH_MIN_BYTES = 64 * 2**20


class CudaBackend:
    """KernelBackend for one CUDA device (one worker process per GPU)."""

    name = "cuda"
    limits_address_space = False

    def __init__(self, device_index: int = 0, flush_l2: bool = True) -> None:
        self.device_index = device_index
        self.flush_l2 = flush_l2
        self._flush_buffer: Any = None

    @property
    def device(self) -> Any:
        return torch.device("cuda", self.device_index)

    def available(self) -> bool:
        return torch is not None and torch.cuda.is_available() and torch.cuda.device_count() > self.device_index

    def device_string(self) -> str:
        return f"cuda:{self.device_index}"

    def describe(self) -> str:
        props = torch.cuda.get_device_properties(self.device_index)
        triton = triton_support.version()
        return (
            f"cuda:{self.device_index} ({props.name}, sm_{props.major}{props.minor}, "
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
            f"{f', Triton {triton}' if triton else ''})"
        )

    def physical_index(self) -> int:
        """Index of this device among all GPUs of the host (CUDA_VISIBLE_DEVICES may renumber them)."""
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if self.device_index < len(visible) and visible[self.device_index].isdigit():
            return int(visible[self.device_index])
        return self.device_index

    def activate(self) -> None:
        """Make this device current, so candidate code that says `.cuda()` lands on it, and allocate first what the
        worker keeps to its end: the L2 flush buffer and cuBLAS's workspace (made at the first matmul, kept per
        stream). Allocated later, each is carved out of whatever large block was freed last, and that block can be
        neither reused whole nor given back: on an 80 GB H100, the output digest's first matmul carved 32 MiB out of
        a freed 16 GiB input set, and the next 16 GiB draw ran out of memory with 16 GiB cached."""
        torch.cuda.set_device(self.device_index)
        self._flush()
        square = torch.ones(2, 2, device=self.device)
        square @ square  # a matrix product and a matrix-vector one (the digest's): both of cuBLAS's paths
        square @ square[0]
        _synchronize(self.device_index)

    def prepare_inputs(self, tensors: Sequence[Any]) -> list[Any]:
        return [t.to(self.device) if isinstance(t, torch.Tensor) else t for t in tensors]

    def synchronize(self) -> None:
        _synchronize(self.device_index)

    def _flush(self) -> None:
        if not self.flush_l2:
            return
        if self._flush_buffer is None:
            l2 = getattr(torch.cuda.get_device_properties(self.device_index), "L2_cache_size", 0) or 0
            nbytes = max(2 * l2, FLUSH_MIN_BYTES)
            self._flush_buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=self.device)
        self._flush_buffer.zero_()

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[float, Any]:
        """Event-timed milliseconds of one call after an L2 flush, and its output."""
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        self._flush()
        _synchronize(self.device_index)
        _event_record(start)
        out = fn(*args)
        _event_record(end)
        _synchronize(self.device_index)
        return _event_elapsed(start, end), out
