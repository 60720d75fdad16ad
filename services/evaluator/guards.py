"""Inside a worker: snapshot the functions trusted code relies on, and report the ones candidate code replaced."""

from __future__ import annotations

import builtins
import sys
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

# Modules of our own whose globals the worker uses after candidate code ran.
OWN_MODULES = (
    "services.evaluator.worker",
    "services.evaluator.runner",
    "services.evaluator.build_cache",
    "services.evaluator.guards",
    "services.evaluator.sandbox",
)


def _namespaces() -> Iterable[tuple[str, Any]]:
    import torch
    import torch.nn.functional
    import torch.serialization

    yield "torch", torch
    yield "torch.nn.functional", torch.nn.functional
    yield "torch.serialization", torch.serialization
    yield "torch.Tensor", torch.Tensor
    yield "torch._C.TensorBase", torch._C.TensorBase
    yield "torch.nn.Module", torch.nn.Module
    yield "time", time
    yield "builtins", builtins
    if "torch.cuda" in sys.modules:
        yield "torch.cuda", sys.modules["torch.cuda"]
        yield "torch.cuda.Event", sys.modules["torch.cuda"].Event
    for name, module in list(sys.modules.items()):
        if name.startswith("services.evaluator.backends.") or name in OWN_MODULES:
            yield name, module


def _members(namespace: Any) -> dict[str, Any]:
    members = vars(namespace) if isinstance(namespace, ModuleType | type) else {}
    # Only callables and classes: data attributes (flags, counters) change legitimately.
    return {name: value for name, value in list(members.items()) if callable(value) or isinstance(value, type)}


# Replaced by torch itself when torch._dynamo is imported (torch.compile): `torch._disable_dynamo(original)`.
LIBRARY_WRAPPED = frozenset({"torch.manual_seed"})


def _benign_wrapper(qualified: str, now: Any, original: Any) -> bool:
    return qualified in LIBRARY_WRAPPED and getattr(now, "__wrapped__", None) is original


class Guard:
    """Identity snapshot of trusted callables, taken before candidate code is imported."""

    def __init__(self) -> None:
        self._snapshot = {label: (ns, _members(ns)) for label, ns in _namespaces()}

    def replaced(self) -> list[str]:
        """Qualified names whose object is no longer the one snapshotted."""
        changed = []
        for label, (namespace, members) in self._snapshot.items():
            current = vars(namespace)
            for name, original in members.items():
                now = current.get(name)
                if now is not original and not _benign_wrapper(f"{label}.{name}", now, original):
                    changed.append(f"{label}.{name}")
        return changed
