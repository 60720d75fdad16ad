"""A tiny IR of element-wise expressions over one tensor, read from Python AST, for kernel generation.

Nodes are tuples: ("in",), ("const", value), ("scalar", index) and (op, *operands) with op one of OPS.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from services.implementer.rules.astutil import canonical, const_value, dotted

Node = tuple

UNARY_CALLS = {
    "relu": "relu",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "exp": "exp",
    "log": "log",
    "abs": "abs",
    "erf": "erf",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "neg": "neg",
    "silu": "silu",
    "gelu": "gelu",
}
FUNCTION_PREFIXES = ("torch.", "torch.nn.functional.", "torch.special.")
BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
MAX_POWER = 8


@dataclass
class Reader:
    """Reads an AST expression into the IR; `root` is the one tensor it may reference."""

    aliases: dict[str, str]
    scalar_attrs: set[str]
    root: str | None = None
    scalars: list[ast.expr] = field(default_factory=list)

    def read(self, node: ast.expr) -> Node | None:
        value = const_value(node, self.aliases)
        if value is not None:
            return ("const", value)
        if isinstance(node, ast.Name):
            if self.root in (None, node.id):
                self.root = node.id
                return ("in",)
            return None
        if isinstance(node, ast.Attribute) and dotted(node) in {f"self.{a}" for a in self.scalar_attrs}:
            for index, seen in enumerate(self.scalars):
                if ast.dump(seen) == ast.dump(node):
                    return ("scalar", index)
            self.scalars.append(node)
            return ("scalar", len(self.scalars) - 1)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            operand = self.read(node.operand)
            return None if operand is None else ("neg", operand)
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _binop(self, node: ast.BinOp) -> Node | None:
        if isinstance(node.op, ast.Pow):
            exponent = const_value(node.right, self.aliases)
            base = self.read(node.left)
            return _power(base, exponent)
        op = BINOPS.get(type(node.op))
        if op is None:
            return None
        left, right = self.read(node.left), self.read(node.right)
        return None if left is None or right is None else (op, left, right)

    def _call(self, node: ast.Call) -> Node | None:
        name = canonical(node.func, self.aliases) or ""
        args = list(node.args)
        if isinstance(node.func, ast.Attribute) and not any(name.startswith(p) for p in FUNCTION_PREFIXES):
            args = [node.func.value, *args]  # method form: x.relu()
            name = node.func.attr
        else:
            if not any(name.startswith(p) for p in FUNCTION_PREFIXES):
                return None
            name = name.rsplit(".", 1)[-1]
        kwargs = {k.arg: k.value for k in node.keywords}
        if not args:
            return None
        if name in UNARY_CALLS and len(args) == 1:
            return self._unary(name, args[0], kwargs)
        if name in ("clamp", "clip"):
            return self._clamp(args, kwargs)
        if name == "pow" and len(args) == 2 and not kwargs:
            return _power(self.read(args[0]), const_value(args[1], self.aliases))
        return None

    def _unary(self, name: str, arg: ast.expr, kwargs: dict[str | None, ast.expr]) -> Node | None:
        op = UNARY_CALLS[name]
        if op == "gelu" and set(kwargs) <= {"approximate"}:
            mode = kwargs.get("approximate")
            if mode is None or (isinstance(mode, ast.Constant) and mode.value in ("none", "tanh")):
                op = "gelu_tanh" if isinstance(mode, ast.Constant) and mode.value == "tanh" else "gelu"
                kwargs = {}
        if kwargs:
            return None
        operand = self.read(arg)
        return None if operand is None else (op, operand)

    def _clamp(self, args: list[ast.expr], kwargs: dict[str | None, ast.expr]) -> Node | None:
        if set(kwargs) - {"min", "max"} or len(args) > 3:
            return None
        low = kwargs.get("min", args[1] if len(args) > 1 else None)
        high = kwargs.get("max", args[2] if len(args) > 2 else None)
        operand = self.read(args[0])
        bounds = [
            None if b is None or (isinstance(b, ast.Constant) and b.value is None) else self.read(b)
            for b in (low, high)
        ]
        if operand is None or any(b is not None and b[0] not in ("const", "scalar") for b in bounds):
            return None
        if bounds == [None, None]:
            return None
        return ("clamp", operand, bounds[0], bounds[1])


def _power(base: Node | None, exponent: float | None) -> Node | None:
    if base is None or exponent is None:
        return None
    if exponent == 0.5:
        return ("sqrt", base)
    if exponent != int(exponent) or not 1 <= abs(exponent) <= MAX_POWER:
        return None
    return ("pow", base, int(exponent))


def op_count(node: Node) -> int:
    if node[0] in ("in", "const", "scalar"):
        return 0
    return 1 + sum(op_count(child) for child in node[1:] if isinstance(child, tuple))


def depends_on_input(node: Node) -> bool:
    if node[0] == "in":
        return True
    return any(isinstance(child, tuple) and depends_on_input(child) for child in node[1:])


def scalar_attributes(init: ast.FunctionDef | None) -> set[str]:
    """`self.x = <arithmetic of constructor arguments and numbers>` in __init__: plain Python scalars."""
    if init is None:
        return set()
    params = {a.arg for a in init.args.args[1:] + init.args.kwonlyargs}
    found: set[str] = set()
    for stmt in ast.walk(init):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if (
                isinstance(target, ast.Attribute)
                and dotted(target.value) == "self"
                and _scalar_expr(stmt.value, params)
            ):
                found.add(target.attr)
    return found


def _scalar_expr(node: ast.AST, params: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in params
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _scalar_expr(node.left, params) and _scalar_expr(node.right, params)
    if isinstance(node, ast.UnaryOp):
        return _scalar_expr(node.operand, params)
    if (
        isinstance(node, ast.Call)
        and dotted(node.func) in ("float", "int", "math.sqrt", "math.log")
        and not node.keywords
    ):
        return all(_scalar_expr(a, params) for a in node.args)
    return False
