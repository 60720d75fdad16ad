"""What every rewrite rule is: a name, trigger phrases, `applies` and `apply` over the module's AST."""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field
from typing import Protocol

from services.implementer.rules.astutil import body_function, to_ssa
from shared.contracts import Target


@dataclass
class Context:
    """Facts about the module being rewritten, shared by the rules of one request."""

    target: Target
    cls: ast.ClassDef
    applied: list[str] = field(default_factory=list)  # techniques recorded by earlier turns and this one
    aliases: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    def skip(self, reason: str) -> bool:
        """Record why a rule does not apply; returns False so `applies` can `return ctx.skip(...)`."""
        self.reason = reason
        return False

    def ssa_forward(self, action: str) -> ast.FunctionDef | None:
        """A copy of the model's forward in SSA form for a rule to rewrite, or None with the reason recorded.

        `action` completes "only straight-line forwards are ..." in that reason.
        """
        original = body_function(self.cls)
        if original is None:
            self.skip("the model has no forward")
            return None
        func = copy.deepcopy(original)
        if not to_ssa(func):
            self.skip(f"forward has control flow; only straight-line forwards are {action}")
            return None
        return func


class Technique(Protocol):
    name: str
    summary: str
    example: str  # a suggestion that triggers it (docs, tests, the technique table)
    triggers: tuple[str, ...]

    def applies(self, tree: ast.Module, ctx: Context) -> bool: ...

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module: ...


def matches(technique: Technique, text: str) -> bool:
    return any(re.search(pattern, text, re.IGNORECASE) for pattern in technique.triggers)
