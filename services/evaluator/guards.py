"""Inside a worker: snapshot the functions trusted code relies on, and report the ones candidate code replaced.

A tripwire, not a wall: it runs in the candidate's own process, so a candidate that edits the guard itself (or the
interpreter's memory) can silence it. Verdicts that matter do not rest on it: timing is bounded by the judge's
clock and a checked output by the sketch the block committed to (output_digest). What it catches cheaply is the
direct route, a name rebound or a function's code swapped, at every digest, save and the end of the job.
"""

from __future__ import annotations

import builtins
import sys
import time
from collections.abc import Iterable
from types import FunctionType, ModuleType
from typing import Any

# Our package: every module of it loaded in the worker is watched, with the classes it defines.
OWN_PACKAGE = "services.evaluator."


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
        if name.startswith(OWN_PACKAGE) and isinstance(module, ModuleType):
            yield name, module
            for attribute, value in list(vars(module).items()):
                if isinstance(value, type) and value.__module__ == name:
                    yield f"{name}.{attribute}", value


def _watched(value: Any, own: bool) -> bool:
    """Callables and classes (data attributes change legitimately); in our own modules and classes also the
    modules they use by name and the method wrappers (staticmethod, classmethod, property)."""
    if callable(value) or isinstance(value, type):
        return True
    return own and isinstance(value, ModuleType | staticmethod | classmethod | property)


def _code(value: Any) -> Any:
    """The code a function runs (None for what has none): a function whose `__code__` was swapped is replaced too."""
    function = value.__func__ if isinstance(value, staticmethod | classmethod) else value
    if isinstance(function, property):
        function = function.fget
    return function.__code__ if isinstance(function, FunctionType) else None


def _members(label: str, namespace: Any) -> dict[str, tuple[Any, Any]]:
    members = vars(namespace) if isinstance(namespace, ModuleType | type) else {}
    own = label.startswith(OWN_PACKAGE)
    return {name: (value, _code(value)) for name, value in list(members.items()) if _watched(value, own)}


# Replaced by torch itself when torch._dynamo is imported (torch.compile): `torch._disable_dynamo(original)`.
LIBRARY_WRAPPED = frozenset({"torch.manual_seed"})
# Rebound by torch itself to one of its legacy storage classes (torch.set_default_dtype names the default dtype's);
# nothing the worker runs uses it.
LIBRARY_REBOUND = frozenset({"torch.Storage"})


def _benign(qualified: str, now: Any, original: Any) -> bool:
    if qualified in LIBRARY_REBOUND:
        return isinstance(now, type) and now.__module__ == original.__module__ and now.__name__.endswith("Storage")
    return qualified in LIBRARY_WRAPPED and getattr(now, "__wrapped__", None) is original


def _shadows(before: Any, now: Any) -> bool:
    """Whether an object's attribute changed in a way that matters: a callable put in or taken out (a method
    shadowed), or a value the worker set up replaced (a buffer the worker fills lazily starts as None)."""
    return callable(before) or callable(now) or before is not None


class Guard:
    """Identity snapshot of trusted callables (and their code), taken before candidate code is imported, and of
    the attributes of the objects named in `objects` (the worker's context: the pipe it reads commands from, the
    backend that times the calls), where a new attribute would shadow a method."""

    def __init__(self, objects: dict[str, Any] | None = None) -> None:
        self._snapshot = {label: (ns, _members(label, ns)) for label, ns in _namespaces()}
        self._objects = {label: (obj, dict(vars(obj))) for label, obj in (objects or {}).items()}

    def replaced(self) -> list[str]:
        """Qualified names whose object (or code) is no longer the one snapshotted."""
        changed = []
        for label, (namespace, members) in self._snapshot.items():
            current = vars(namespace)
            for name, (original, code) in members.items():
                now = current.get(name)
                if (now is not original or _code(now) is not code) and not _benign(f"{label}.{name}", now, original):
                    changed.append(f"{label}.{name}")
        for label, (obj, attributes) in self._objects.items():
            now = vars(obj)
            changed += [
                f"{label}.{name}"
                for name in sorted(now.keys() | attributes.keys())
                if now.get(name) is not attributes.get(name) and _shadows(attributes.get(name), now.get(name))
            ]
        return changed
