"""What every rewrite rule is: a name, trigger phrases, `applies` and `apply` over the module's AST."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Protocol

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


class Technique(Protocol):
    name: str
    summary: str
    example: str  # a suggestion that triggers it (docs, tests, the technique table)
    triggers: tuple[str, ...]

    def applies(self, tree: ast.Module, ctx: Context) -> bool: ...

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module: ...


def matches(technique: Technique, text: str) -> bool:
    return any(re.search(pattern, text, re.IGNORECASE) for pattern in technique.triggers)
