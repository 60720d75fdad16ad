"""Matching helpers for the library-call patterns: calls in any spelling, reductions, squares, commuted operands."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from services.implementer.rules.astutil import canonical, const_value, parse_expr, same

TOLERANCE = 1e-6


@dataclass
class Op:
    """A call in either spelling: `torch.exp(x)`, `F.softmax(x, ...)` or `x.exp()`."""

    name: str
    args: list[ast.expr]
    kwargs: dict[str, ast.expr]


@dataclass
class Matcher:
    aliases: dict[str, str]
    functional: str  # local name of torch.nn.functional
    param_shapes: dict[str, int]  # self attribute -> number of dims of the Parameter built in __init__

    def op(self, node: ast.AST, *names: str) -> Op | None:
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0:
            node = node.value  # torch.max(x, dim, keepdim=True)[0]
        elif isinstance(node, ast.Attribute) and node.attr == "values":
            node = node.value
        if not isinstance(node, ast.Call):
            return None
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        full = canonical(node.func, self.aliases) or ""
        for prefix in ("torch.nn.functional.", "torch.special.", "torch.linalg.", "torch."):
            if full.startswith(prefix) and full[len(prefix) :] in names:
                return Op(full[len(prefix) :], list(node.args), kwargs)
        if isinstance(node.func, ast.Attribute) and node.func.attr in names and not full.startswith("torch."):
            return Op(node.func.attr, [node.func.value, *node.args], kwargs)
        return None

    def reduction(self, node: ast.AST, *names: str) -> tuple[ast.expr, ast.expr | None, bool] | None:
        """(input, dim, keepdim) of sum/mean/max-like calls; dim None for a full reduction."""
        found = self.op(node, *names)
        if found is None or not found.args:
            return None
        dim = found.kwargs.get("dim", found.args[1] if len(found.args) > 1 else None)
        keep = found.kwargs.get("keepdim", found.args[2] if len(found.args) > 2 else None)
        if set(found.kwargs) - {"dim", "keepdim"}:
            return None
        return found.args[0], dim, isinstance(keep, ast.Constant) and keep.value is True

    def mean(self, node: ast.AST) -> tuple[ast.expr, ast.expr | None, bool] | None:
        found = self.reduction(node, "mean")
        if found is not None:
            return found
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # sum(x, d) / x.shape[d]
            summed = self.reduction(node.left, "sum")
            if summed is not None and summed[1] is not None and is_size(node.right, summed[0], summed[1]):
                return summed
        return None

    def square(self, node: ast.AST) -> ast.expr | None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and same(node.left, node.right):
            return node.left
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and const_value(node.right, self.aliases) == 2:
            return node.left
        found = self.op(node, "pow", "square")
        if found and (
            found.name == "square" or (len(found.args) == 2 and const_value(found.args[1], self.aliases) == 2)
        ):
            return found.args[0]
        return None

    def const_is(self, node: ast.AST, value: float) -> bool:
        found = const_value(node, self.aliases)
        return found is not None and abs(found - value) < TOLERANCE

    def call(self, text: str, **parts: ast.expr) -> ast.expr:
        """Build `text` (with {name} holes for sub-expressions) as an AST."""
        holes = {name: f"__hole_{name}__" for name in parts}
        tree = parse_expr(text.format(F=self.functional, **holes))

        class Fill(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                for name, hole in holes.items():
                    if node.id == hole:
                        return parts[name]
                return node

        return Fill().visit(tree)


def is_size(node: ast.AST, tensor: ast.expr, dim: ast.expr) -> bool:
    """`tensor.shape[dim]` or `tensor.size(dim)`."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        return same(node.value.value, tensor) and same(node.slice, dim)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size" and node.args:
        return same(node.func.value, tensor) and same(node.args[0], dim)
    return False


def binop(node: ast.AST, op: type) -> tuple[ast.expr, ast.expr] | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, op):
        return node.left, node.right
    return None


def commuted(node: ast.AST, op: type) -> list[tuple[ast.expr, ast.expr]]:
    pair = binop(node, op)
    return [] if pair is None else [pair, (pair[1], pair[0])]


def same_dim(a: ast.expr | None, b: ast.expr | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and same(a, b))
