"""Device backends by name; adding a backend means adding one file and one entry here."""

from __future__ import annotations

from collections.abc import Callable

from services.evaluator.backends.base import KernelBackend
from services.evaluator.backends.cpu import CpuBackend
from services.evaluator.backends.cuda import CudaBackend

BACKENDS: dict[str, Callable[[], KernelBackend]] = {
    "cpu": CpuBackend,
    "cuda": CudaBackend,
}


def get_backend(name: str) -> KernelBackend:
    """Instantiate the backend called `name` (`cpu`, `cuda`); KeyError names the known ones."""
    try:
        return BACKENDS[name]()
    except KeyError:
        raise KeyError(f"no backend {name!r}; known: {sorted(BACKENDS)}") from None


def resolve_device(requested: str) -> str:
    """Map a request's `device` to a backend name: `auto` is `cuda` when one is available, else `cpu`."""
    if requested != "auto":
        return requested
    cuda = BACKENDS.get("cuda")
    return "cuda" if cuda is not None and cuda().available() else "cpu"


__all__ = ["BACKENDS", "KernelBackend", "get_backend", "resolve_device"]
