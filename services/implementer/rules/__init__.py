"""The builtin implementer's rule engine: recognise techniques in a suggestion, rewrite the kernel with `ast`.

The source is parsed and rewritten, never executed. Techniques apply in the fixed order of TECHNIQUES.
"""

from __future__ import annotations

import ast
import copy
import logging
import re
from dataclasses import dataclass, field

from services.implementer.rules.astutil import import_aliases, model_class, render
from services.implementer.rules.base import Context, Technique, matches
from services.implementer.rules.execution import (
    ChannelsLast,
    CudaGraphs,
    CudnnBenchmark,
    HalfPrecision,
    Tf32,
    TorchCompile,
)
from services.implementer.rules.fuse_elementwise import FuseElementwise
from services.implementer.rules.hoist import HoistConstants
from services.implementer.rules.inplace import InplaceOps
from services.implementer.rules.library import FusedLibraryCalls
from services.implementer.rules.redundant import RemoveRedundant
from shared.contracts import Target

log = logging.getLogger(__name__)

MARKER_PREFIX = "# kernel-agent techniques:"
MARKER = re.compile(r"^# kernel-agent techniques:(.*)$", re.MULTILINE)

TECHNIQUES: tuple[Technique, ...] = (
    RemoveRedundant(),
    HoistConstants(),
    FusedLibraryCalls(),
    FuseElementwise(),
    InplaceOps(),
    ChannelsLast(),
    HalfPrecision(),
    Tf32(),
    CudnnBenchmark(),
    TorchCompile(),
    CudaGraphs(),
)
ORDER = [t.name for t in TECHNIQUES]


class RewriteError(ValueError):
    """The current kernel cannot be rewritten (does not parse, no model class)."""


@dataclass
class Rewrite:
    source: str
    applied: list[str] = field(default_factory=list)
    recognised: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def recognise(suggestion: str) -> list[Technique]:
    return [t for t in TECHNIQUES if matches(t, suggestion)]


def load_module(source: str) -> tuple[ast.Module, list[str]]:
    """Parse kernel B, rename a reference `Model` to `ModelNew`, and read the techniques earlier turns recorded."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise RewriteError(f"current_source does not parse: {exc.msg} (line {exc.lineno})") from exc
    if model_class(tree) is None:
        if not any(isinstance(n, ast.ClassDef) and n.name == "Model" for n in tree.body):
            raise RewriteError("current_source defines neither ModelNew nor Model")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "Model":
                node.name = "ModelNew"
            elif isinstance(node, ast.Name) and node.id == "Model":
                node.id = "ModelNew"
    found = MARKER.search(source)
    earlier = [name.strip() for name in found.group(1).split(",") if name.strip()] if found else []
    return tree, [name for name in earlier if name in ORDER]


def rewrite(current_source: str, suggestion: str, target: Target) -> Rewrite:
    tree, earlier = load_module(current_source)
    cls = model_class(tree)
    assert cls is not None
    ctx = Context(target=target, cls=cls, applied=list(earlier), aliases=import_aliases(tree))
    result = Rewrite(source="")
    for technique in recognise(suggestion):
        result.recognised.append(technique.name)
        ctx.reason = ""
        if not technique.applies(tree, ctx):
            result.notes.append(f"{technique.name} not applied: {ctx.reason}")
            continue
        backup = copy.deepcopy(tree)
        if technique.name not in ctx.applied:
            ctx.applied.append(technique.name)
        try:
            tree = ast.fix_missing_locations(technique.apply(tree, ctx))
            ast.parse(ast.unparse(tree))
        except Exception:  # a rule bug must not lose the kernel: keep the last good tree
            log.exception("rule %s failed", technique.name)
            tree, ctx.applied = backup, [n for n in ctx.applied if n != technique.name or n in earlier]
            ctx.cls = model_class(tree)  # type: ignore[assignment]
            result.notes.append(f"{technique.name} not applied: the rewrite failed on this kernel")
            continue
        ctx.cls = model_class(tree)  # type: ignore[assignment]
        ctx.aliases = import_aliases(tree)
        result.applied.append(technique.name)
    recorded = sorted(set(ctx.applied), key=ORDER.index)
    marker = f"{MARKER_PREFIX} {', '.join(recorded)}" if recorded else f"{MARKER_PREFIX} none"
    result.source = render(tree, marker)
    return result


def vocabulary() -> list[dict[str, object]]:
    """Each technique with its summary and trigger patterns (for /health and the docs)."""
    return [
        {"name": t.name, "summary": t.summary, "example": t.example, "triggers": list(t.triggers)} for t in TECHNIQUES
    ]
