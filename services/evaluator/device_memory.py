"""Admission to a GPU's memory: an evaluation reserves what its workers will hold there before they start, and waits
while the GPU is full, so that two evaluations never run each other out of memory (a CUDA out-of-memory error
would then be a verdict on a candidate for what another job held)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator

# What one CUDA worker holds on its GPU before it runs anything: the CUDA context, cuBLAS's workspace and the
# kernels torch and the output digest load. Measured on an H100 with torch 2.11 (BENCHMARKS.md) and rounded up.
WORKER_CONTEXT_BYTES = 1 << 30
GIB = 1 << 30


class DoesNotFitError(ValueError):
    """An evaluation needs more device memory than the GPU lets evaluations reserve."""


def evaluation_need(reference_peak: int, block_bytes: int) -> int:
    """Device memory one evaluation reserves: its two workers (the reference's timer and the candidate), each holding
    the larger of what the reference's run peaked at (a trial's inputs, a copy of them, its outputs and whatever the
    model allocates on the way) and a timed block's data, and each its context. The candidate's share is the
    reference's: a candidate that needs more than its reference runs out of its share, as it would of a GPU of that
    size."""
    return 2 * (max(reference_peak, block_bytes) + WORKER_CONTEXT_BYTES)


class DeviceMemory:
    """The memory of one GPU that evaluations reserve, first come first served: a reservation waits until every
    earlier one was granted and its own fits beside those held. `capacity` is None until the service knows it (a
    worker on the GPU reported its size); until then, and for a reservation of the whole device, one at a time."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.reserved = 0
        self.exclusive = False
        self._queue: deque[object] = deque()
        self._changed = asyncio.Condition()

    async def learn_capacity(self, capacity: int) -> None:
        """The capacity, once known (a capacity set by the settings stays)."""
        if self.capacity is None:
            async with self._changed:
                self.capacity = max(0, capacity)
                self._changed.notify_all()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _fits(self, nbytes: int | None) -> bool:
        if self.exclusive:
            return False
        if nbytes is None or self.capacity is None:
            return self.reserved == 0
        return self.reserved + nbytes <= self.capacity

    def check(self, nbytes: int, what: str) -> None:
        """DoesNotFitError when `nbytes` can never be granted; `what` says where the figure comes from."""
        if self.capacity is not None and nbytes > self.capacity:
            raise DoesNotFitError(
                f"{what} needs {nbytes / GIB:.1f} GiB of device memory; evaluations on this GPU may reserve "
                f"{self.capacity / GIB:.1f} GiB (EVALUATOR_DEVICE_MEMORY_MB, or the GPU's memory less what idle "
                f"workers and builders hold)"
            )

    @contextlib.asynccontextmanager
    async def reserve(self, nbytes: int | None, what: str) -> AsyncIterator[float]:
        """Hold `nbytes` (None: the whole device) until the block ends; yields the seconds it waited."""
        if nbytes is not None:
            self.check(nbytes, what)
        asked = time.monotonic()
        ticket = object()
        async with self._changed:
            self._queue.append(ticket)
            try:
                await self._changed.wait_for(lambda: self._queue[0] is ticket and self._fits(nbytes))
            finally:
                # Granted or cancelled, the next in line may now fit.
                self._queue.remove(ticket)
                self._changed.notify_all()
            if nbytes is None:
                self.exclusive = True
            else:
                self.reserved += nbytes
        try:
            yield time.monotonic() - asked
        finally:
            async with self._changed:
                if nbytes is None:
                    self.exclusive = False
                else:
                    self.reserved -= nbytes
                self._changed.notify_all()
