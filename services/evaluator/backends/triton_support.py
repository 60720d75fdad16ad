"""Triton candidates on the CUDA backend: whether Triton is there, and which version.

Triton kernels run on the worker's GPU and are timed by the CUDA backend like any other call; what differs is
the compile step. Triton JIT-compiles at the first call (so a Triton compile error surfaces as a `runtime_error`)
and caches by a hash of the kernel source and options. Its cache (`TRITON_CACHE_DIR`) is in the job's private
directory (sandbox.py): a cache shared by writable workers would let one candidate plant a binary under another
kernel's key. The worker imports triton before candidate code runs (runner.py), so what that import patches in
torch is not mistaken for the candidate's doing.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version


def available() -> bool:
    """Triton is importable (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("triton") is not None


def version() -> str | None:
    try:
        return dist_version("triton") if available() else None
    except PackageNotFoundError:
        return None
