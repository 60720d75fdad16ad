"""The interface every device backend implements; the worker calls only these methods."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class KernelBackend(Protocol):
    """One device family (CPU, CUDA); one file per backend, registered in `backends.BACKENDS`."""

    name: str
    # False where an address-space rlimit would break the device runtime (CUDA maps huge virtual ranges).
    limits_address_space: bool

    def available(self) -> bool:
        """The device exists on this machine."""

    def activate(self) -> None:
        """Make this device the worker's current one (candidate code may say `.cuda()` without an index)."""

    def device_string(self) -> str:
        """torch device to place models and inputs on, e.g. `cpu` or `cuda:0`."""

    def prepare_inputs(self, values: Sequence[Any]) -> list[Any]:
        """Move the tensors among `values` to the device; other values pass unchanged."""

    def synchronize(self) -> None:
        """Wait until queued device work is finished."""

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[float, Any]:
        """Call `fn(*args)` once; its latency in milliseconds and its output."""

    def describe(self) -> str:
        """Human-readable device name for results, e.g. `cpu (x86_64, 2 threads)`."""
