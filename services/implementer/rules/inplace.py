"""inplace_ops: element-wise ops on a temporary that forward owns and never reads again run in place.

Only temporaries forward created itself (arithmetic results, fresh torch/F/layer outputs, in-place results of
those) are mutated; inputs, parameters and views of them never are (mutating an input is what the evaluator flags).
"""

from __future__ import annotations

import ast

from services.implementer.rules.astutil import (
    body_function,
    canonical,
    const_value,
    dotted,
    from_ssa,
    loads,
    method,
)
from services.implementer.rules.base import Context
from services.implementer.rules.ewir import scalar_attributes

UNARY_INPLACE = {
    "relu": "relu_",
    "sigmoid": "sigmoid_",
    "tanh": "tanh_",
    "exp": "exp_",
    "abs": "abs_",
    "neg": "neg_",
    "sqrt": "sqrt_",
    "log": "log_",
    "clamp": "clamp_",
    "clip": "clamp_",
    "square": "square_",
}
BINARY_INPLACE = {ast.Add: "add_", ast.Sub: "sub_", ast.Mult: "mul_", ast.Div: "div_"}
COMMUTATIVE = (ast.Add, ast.Mult)
# Layers whose output is a fresh tensor (nn.Identity, nn.Flatten or eval-mode Dropout may return a view of the input).
FRESH_LAYERS = (
    "Linear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "LayerNorm",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "Embedding",
    "RMSNorm",
)
VIEWISH = frozenset(
    {
        "view",
        "reshape",
        "transpose",
        "permute",
        "t",
        "contiguous",
        "to",
        "float",
        "half",
        "double",
        "type",
        "expand",
        "squeeze",
        "unsqueeze",
        "flatten",
        "narrow",
        "select",
        "detach",
        "as_strided",
        "view_as",
        "reshape_as",
        "expand_as",
        "unflatten",
        "movedim",
        "swapaxes",
        "split",
        "chunk",
        "unbind",
        "real",
    }
)


def _fresh_layers(init: ast.FunctionDef | None) -> set[str]:
    found: set[str] = set()
    for stmt in ast.walk(init) if init else []:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Attribute)
            and isinstance(stmt.value, ast.Call)
            and (dotted(stmt.value.func) or "").rsplit(".", 1)[-1] in FRESH_LAYERS
        ):
            found.add(f"self.{stmt.targets[0].attr}")
    return found


class InplaceOps:
    example = "Apply the element-wise ops in place to avoid extra allocations."
    name = "inplace_ops"
    summary = "element-wise ops on temporaries forward owns (never inputs) run in place: x = torch.relu(x) -> x.relu_()"
    triggers: tuple[str, ...] = (
        r"in[- ]?place",
        r"avoid (extra |the )?(allocation|temporar|cop)",
        r"reuse (the )?(buffer|memory|storage)",
        r"fewer allocations",
        r"\w+_\(\)",
    )

    def _rewrite(self, ctx: Context) -> ast.FunctionDef | None:
        func = ctx.ssa_forward("rewritten")
        if func is None:
            return None
        layers = _fresh_layers(method(ctx.cls, "__init__"))
        scalars = {f"self.{a}" for a in scalar_attributes(method(ctx.cls, "__init__"))}
        owned: set[str] = set()
        changed = False
        for index, stmt in enumerate(func.body):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                continue
            later = set().union(*(loads(s) for s in func.body[index + 1 :]))
            new = self._inplace(stmt.value, owned - later, ctx, scalars)
            if new is not None:
                stmt.value, changed = new, True
                owned.add(stmt.targets[0].id)
            elif self._fresh(stmt.value, ctx, layers):
                owned.add(stmt.targets[0].id)
        if not changed:
            ctx.skip("no element-wise op in forward works on a temporary it owns (inputs are never mutated)")
            return None
        return func

    def _fresh(self, value: ast.expr, ctx: Context, layers: set[str]) -> bool:
        if isinstance(value, ast.BinOp):
            return True
        if not isinstance(value, ast.Call):
            return False
        name = canonical(value.func, ctx.aliases) or ""
        if name in layers:
            return True
        last = name.rsplit(".", 1)[-1] if name else getattr(value.func, "attr", "")
        return (
            name.startswith("torch.")
            and last not in VIEWISH
            and not last.endswith("_")
            and not name.startswith("torch.nn.functional.dropout")
        )

    def _inplace(self, value: ast.expr, free: set[str], ctx: Context, scalars: set[str]) -> ast.expr | None:
        """`value` rewritten to mutate one of the `free` temporaries, or None."""
        if isinstance(value, ast.BinOp) and type(value.op) in BINARY_INPLACE:
            pairs = [(value.left, value.right)]
            if isinstance(value.op, COMMUTATIVE):
                pairs.append((value.right, value.left))
            for tensor, other in pairs:
                scalar = const_value(other, ctx.aliases) is not None or dotted(other) in scalars
                if isinstance(tensor, ast.Name) and tensor.id in free and scalar:
                    return ast.Call(ast.Attribute(tensor, BINARY_INPLACE[type(value.op)], ast.Load()), [other], [])
            return None
        if not isinstance(value, ast.Call):
            return None
        name = canonical(value.func, ctx.aliases) or ""
        if name.startswith(("torch.", "torch.nn.functional.")):
            op, args = name.rsplit(".", 1)[-1], list(value.args)
        elif isinstance(value.func, ast.Attribute) and dotted(value.func.value) is not None:
            op, args = value.func.attr, [value.func.value, *value.args]
        else:
            return None
        if op not in UNARY_INPLACE or not args or not isinstance(args[0], ast.Name) or args[0].id not in free:
            return None
        if op not in ("clamp", "clip") and (len(args) > 1 or value.keywords):
            return None
        return ast.Call(ast.Attribute(args[0], UNARY_INPLACE[op], ast.Load()), args[1:], value.keywords)

    def applies(self, tree: ast.Module, ctx: Context) -> bool:
        return self._rewrite(ctx) is not None

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        func = self._rewrite(ctx)
        assert func is not None
        body_function(ctx.cls).body = from_ssa(func).body  # type: ignore[union-attr]
        return tree
