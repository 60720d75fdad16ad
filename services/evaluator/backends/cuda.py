"""CUDA backend: inputs on one GPU, CUDA-event timing with an L2 flush, device-wide synchronisation.

Every trial: flush L2 (overwrite a buffer twice the L2 size), synchronise the whole device, record a start event,
call, record an end event, synchronise the whole device again. The event pair gives the precise time of the work
on the current stream; the host clock around the call and the device-wide synchronise also sees work the
candidate put on other streams. A candidate whose host-side time exceeds its event time by much more than the
reference's does is doing unaccounted work off the current stream (`side_stream`), and is then timed by the host
clock. Reference and candidate are interleaved trial by trial (alternating which goes first), so clock and thermal
drift hit both alike.

The timer functions are bound when this module is imported, before any candidate code runs, so patching
`torch.cuda.Event` or `time.perf_counter` afterwards does not change what we measure (guards.py flags the patch).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
_perf_counter = time.perf_counter

# A side-stream verdict needs both: this much host time beyond the reference's overhead, and this fraction of the
# candidate's event time.
SIDE_STREAM_MIN_EXCESS_MS = 0.05
SIDE_STREAM_MIN_FRACTION = 0.5
FLUSH_MIN_BYTES = 64 * 2**20


@dataclass
class TrialTimes:
    """Per-trial milliseconds of one callable: CUDA-event time and host time around the device-wide sync."""

    event_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)

    def overhead_ms(self) -> float:
        return statistics.median(w - e for w, e in zip(self.wall_ms, self.event_ms, strict=True))


def side_stream_suspected(reference: TrialTimes, candidate: TrialTimes) -> bool:
    """The candidate's host time exceeds its event time by far more than the reference's does."""
    excess = candidate.overhead_ms() - reference.overhead_ms()
    return excess > max(SIDE_STREAM_MIN_EXCESS_MS, SIDE_STREAM_MIN_FRACTION * statistics.median(candidate.event_ms))


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

    @contextlib.contextmanager
    def exclusive(self, lock_dir: Path) -> Iterator[None]:
        """Hold this GPU alone while measuring: flock on `gpu-<index>.lock` (prepared by the service).

        Workers build in parallel and take turns on the GPU; the kernel drops the lock if a worker dies.
        """
        path = Path(lock_dir) / f"gpu-{self.physical_index()}.lock"
        if not path.exists():
            yield
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def activate(self) -> None:
        """Make this device current, so candidate code that says `.cuda()` lands on it."""
        torch.cuda.set_device(self.device_index)

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

    def time_one(self, fn: Callable[..., Any], args: Sequence[Any], times: TrialTimes) -> None:
        """One timed call, appended to `times`; the output is dropped."""
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        self._flush()
        _synchronize(self.device_index)
        t0 = _perf_counter()
        _event_record(start)
        out = fn(*args)
        _event_record(end)
        _synchronize(self.device_index)
        t1 = _perf_counter()
        del out
        times.event_ms.append(_event_elapsed(start, end))
        times.wall_ms.append((t1 - t0) * 1e3)

    def time_calls(self, fn: Callable[..., Any], args: Sequence[Any], n: int) -> list[float]:
        """Event-timed milliseconds of `n` calls, each after an L2 flush."""
        times = TrialTimes()
        for _ in range(n):
            self.time_one(fn, args, times)
        return times.event_ms

    def time_interleaved(
        self,
        fns: dict[str, Callable[..., Any]],
        arg_sets: Sequence[Sequence[Any]],
        n: int,
        warmup: int = 3,
    ) -> dict[str, TrialTimes]:
        """Time each callable `n` times, interleaved trial by trial, rotating through `arg_sets`.

        The order within a trial alternates so neither side always runs on a freshly flushed, cooler or hotter
        GPU; rotating inputs means no call sees the buffers of the call before it.
        """
        names = list(fns)
        with torch.no_grad():
            for i in range(warmup):
                for name in names:
                    fns[name](*arg_sets[i % len(arg_sets)])
            _synchronize(self.device_index)
            results = {name: TrialTimes() for name in names}
            for i in range(n):
                order = names if i % 2 == 0 else names[::-1]
                for name in order:
                    self.time_one(fns[name], arg_sets[i % len(arg_sets)], results[name])
        return results
