"""remove_redundant: common sub-expression elimination in forward (the same pure expression computed twice -> once)."""

from __future__ import annotations

import ast
import copy
from collections import Counter

from services.implementer.rules.astutil import body_function, dotted, drop_dead, from_ssa, is_impure, visit_expr
from services.implementer.rules.base import Context

COMPUTATIONS = (ast.Call, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Subscript)


def _pure(node: ast.AST) -> bool:
    """No randomness, no in-place call, no submodule call (a layer may be random, e.g. dropout)."""
    if is_impure(node):
        return False
    return not any(isinstance(s, ast.Call) and (dotted(s.func) or "").startswith("self.") for s in ast.walk(node))


def _reads_something(node: ast.AST) -> bool:
    return any(isinstance(s, ast.Name) and s.id not in ("torch", "math", "F") for s in ast.walk(node))


def _values(func: ast.FunctionDef) -> list[tuple[int, ast.expr]]:
    return [
        (i, s.value)
        for i, s in enumerate(func.body)
        if isinstance(s, ast.Assign | ast.Return | ast.Expr) and s.value is not None
    ]


def _repeated(func: ast.FunctionDef) -> ast.expr | None:
    """The largest pure computation that occurs at least twice in forward."""
    counts: Counter[str] = Counter()
    nodes: dict[str, ast.expr] = {}
    for _, value in _values(func):
        for node in ast.walk(value):
            if isinstance(node, COMPUTATIONS) and not isinstance(getattr(node, "ctx", None), ast.Store):
                key = ast.dump(node)
                counts[key] += 1
                nodes.setdefault(key, node)
    repeated = [nodes[k] for k, n in counts.items() if n > 1 and _pure(nodes[k]) and _reads_something(nodes[k])]
    return max(repeated, key=lambda n: len(ast.dump(n)), default=None)


class _Replace(ast.NodeTransformer):
    def __init__(self, key: str, name: str) -> None:
        self.key, self.name = key, name

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and ast.dump(node) == self.key:
            return ast.Name(self.name, ast.Load())
        return super().visit(node)


class RemoveRedundant:
    example = "Remove the redundant computation: compute the duplicated expression once."
    name = "remove_redundant"
    summary = "common sub-expression elimination: a pure expression computed more than once in forward is computed once"
    triggers: tuple[str, ...] = (
        r"redundan",
        r"common sub-?expression",
        r"\bcse\b",
        r"duplicat",
        r"computed (twice|more than once)",
        r"\brecomput",
        r"reuse (the )?(result|intermediate|value)",
        r"same (expression|computation)",
    )

    def _rewrite(self, ctx: Context) -> ast.FunctionDef | None:
        func = ctx.ssa_forward("analysed")
        if func is None:
            return None
        changed = False
        taken = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
        while (expr := _repeated(func)) is not None:
            key = ast.dump(expr)
            first = next(i for i, value in _values(func) if any(ast.dump(n) == key for n in ast.walk(value)))
            stmt = func.body[first]
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and ast.dump(stmt.value) == key
            ):
                name, start = stmt.targets[0].id, first + 1  # an earlier assignment already holds the value
            else:
                name = next(f"common_{i}" for i in range(len(taken) + 1) if f"common_{i}" not in taken)
                taken.add(name)
                func.body.insert(first, ast.Assign([ast.Name(name, ast.Store())], copy.deepcopy(expr)))
                start = first + 1
            for stmt in func.body[start:]:
                if isinstance(stmt, ast.Assign | ast.Return | ast.Expr) and stmt.value is not None:
                    stmt.value = visit_expr(_Replace(key, name), stmt.value)
            changed = True
        if not changed:
            ctx.skip("no expression in forward is computed more than once")
            return None
        drop_dead(func)
        return func

    def applies(self, tree: ast.Module, ctx: Context) -> bool:
        return self._rewrite(ctx) is not None

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        func = self._rewrite(ctx)
        assert func is not None
        body_function(ctx.cls).body = from_ssa(func).body  # type: ignore[union-attr]
        return tree
