"""fused_library_calls: hand-written softmax / log-softmax / layer norm / RMS norm / GELU / SiLU / Mish / attention /
MSE / linear / variance / L2 norm become the torch.nn.functional (or torch) call that computes the same thing."""

from __future__ import annotations

import ast
import copy

from services.implementer.rules.astutil import (
    body_function,
    definitions,
    drop_dead,
    from_ssa,
    functional_alias,
    functional_name,
    import_aliases,
    inline,
    method,
    visit_expr,
)
from services.implementer.rules.base import Context
from services.implementer.rules.patterns import PATTERNS, Matcher


def parameter_ranks(init: ast.FunctionDef | None) -> dict[str, int]:
    """`self.w = nn.Parameter(torch.ones(a, b))` -> {"w": 2}: how many dims each directly built Parameter has."""
    ranks: dict[str, int] = {}
    for stmt in ast.walk(init) if init else []:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)):
            continue
        value = stmt.value
        if (
            isinstance(value, ast.Call)
            and getattr(value.func, "attr", getattr(value.func, "id", "")) == "Parameter"
            and value.args
        ):
            inner = value.args[0]
            while isinstance(inner, ast.BinOp):  # torch.randn(o, i) / math.sqrt(i)
                inner = inner.left
            if isinstance(inner, ast.Call) and inner.args and not any(isinstance(a, ast.Starred) for a in inner.args):
                sizes = inner.args if not isinstance(inner.args[0], ast.Tuple | ast.List) else inner.args[0].elts
                ranks[stmt.targets[0].attr] = len(sizes)
    return ranks


class _Rewriter(ast.NodeTransformer):
    """Bottom-up: children first, so an inner rewrite (softmax) can feed an outer one (attention)."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.found: list[str] = []

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if isinstance(node, ast.expr):
            for name, pattern in PATTERNS:
                replacement = pattern(self.matcher, node)
                if replacement is not None:
                    self.found.append(name)
                    return replacement
        return node


def _refold(expr: ast.expr, known: dict[str, str]) -> ast.expr:
    """Put names back for sub-expressions an earlier statement already computes (largest first)."""

    class Refold(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            if isinstance(node, ast.expr) and not isinstance(node, ast.Name) and ast.dump(node) in known:
                return ast.Name(known[ast.dump(node)], ast.Load())
            return super().visit(node)

    return visit_expr(Refold(), expr)


class FusedLibraryCalls:
    example = "Replace the hand-written math with the fused library call from torch.nn.functional."
    name = "fused_library_calls"
    summary = (
        "hand-written softmax, log-softmax, layer/RMS norm, GELU (erf/tanh), SiLU, Mish, softplus, attention, "
        "MSE, matmul+bias, variance and L2 norm -> the fused torch.nn.functional / torch call"
    )
    triggers: tuple[str, ...] = (
        r"\blibrary\b",
        r"built-?in (op|function|kernel|implementation)",
        r"native (op|kernel|implementation)",
        r"torch\.nn\.functional",
        r"\bF\.\w+",
        r"scaled[_ ]dot[_ ]product",
        r"flash[- ]?attention",
        r"\bsdpa\b",
        r"fused (softmax|log[_ -]?softmax|layer[_ ]?norm|rms[_ ]?norm|gelu|silu|attention|linear|mse)",
        r"hand-?(written|rolled)|manual (softmax|layer ?norm|rms ?norm|gelu|silu|attention)",
        r"(use|call|replace .* with) (torch\.)?(softmax|log_softmax|layer_norm|rms_norm|gelu|silu|mish|mse_loss|linear)",
    )

    def _rewrite(self, tree: ast.Module, ctx: Context) -> tuple[ast.FunctionDef, list[str]] | None:
        func = ctx.ssa_forward("pattern-matched")
        if func is None:
            return None
        alias = functional_name(tree)
        matcher = Matcher(
            {**ctx.aliases, alias: "torch.nn.functional"}, alias, parameter_ranks(method(ctx.cls, "__init__"))
        )
        defs = definitions(func)
        found: list[str] = []
        for index, stmt in enumerate(func.body):
            if not isinstance(stmt, ast.Assign | ast.Return) or stmt.value is None:
                continue
            rewriter = _Rewriter(matcher)
            rewritten = rewriter.visit(inline(stmt.value, defs))
            if not rewriter.found:
                continue
            found += rewriter.found
            earlier = {ast.dump(inline(defs[n], defs)): n for s in func.body[:index] for n in _assigned(s) if n in defs}
            stmt.value = _refold(rewritten, earlier)
            for name in _assigned(stmt):
                defs[name] = stmt.value
        if not found:
            ctx.skip("no hand-written softmax/norm/GELU/SiLU/attention/MSE/linear idiom found in forward")
            return None
        drop_dead(func)
        return func, found

    def applies(self, tree: ast.Module, ctx: Context) -> bool:
        return self._rewrite(copy.deepcopy(tree), ctx) is not None

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        result = self._rewrite(tree, ctx)
        assert result is not None
        func, _ = result
        functional_alias(tree)
        ctx.aliases = import_aliases(tree)
        body_function(ctx.cls).body = from_ssa(func).body  # type: ignore[union-attr]
        return tree


def _assigned(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return [stmt.targets[0].id]
    return []
