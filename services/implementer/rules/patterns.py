"""Matchers for hand-written idioms (softmax, norms, GELU, SiLU, attention, MSE, ...) on inlined forward expressions.

Each matcher takes an expression and returns the library-call expression that computes the same thing, or None.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from services.implementer.rules.astutil import const_value, same
from services.implementer.rules.matcher import TOLERANCE, Matcher, Op, binop, commuted, same_dim


def softmax(m: Matcher, node: ast.AST) -> ast.expr | None:
    pair = binop(node, ast.Div)
    if pair is None:
        return None
    numerator, denominator = pair
    total = m.reduction(denominator, "sum")
    exp = m.op(numerator, "exp")
    if total is None or exp is None or not same(total[0], numerator) or not total[2] or total[1] is None:
        return None
    shifted = binop(exp.args[0], ast.Sub)
    if shifted is not None:
        peak = m.reduction(shifted[1], "max", "amax")
        if peak is not None and same(peak[0], shifted[0]) and same_dim(peak[1], total[1]) and peak[2]:
            return m.call("{F}.softmax({x}, dim={d})", x=shifted[0], d=total[1])
    return m.call("{F}.softmax({x}, dim={d})", x=exp.args[0], d=total[1])


def log_softmax(m: Matcher, node: ast.AST) -> ast.expr | None:
    pair = binop(node, ast.Sub)
    if pair is None:
        return None
    shifted, log_total = pair
    lse = m.reduction(log_total, "logsumexp")
    if lse is not None and same(lse[0], shifted) and lse[2] and lse[1] is not None:
        return m.call("{F}.log_softmax({x}, dim={d})", x=shifted, d=lse[1])
    log = m.op(log_total, "log")
    total = m.reduction(log.args[0], "sum") if log else None
    exp = m.op(total[0], "exp") if total else None
    inner = binop(shifted, ast.Sub)
    if (
        exp is None
        or inner is None
        or total is None
        or not total[2]
        or total[1] is None
        or not same(exp.args[0], shifted)
    ):
        return None
    peak = m.reduction(inner[1], "max", "amax")
    if peak is None or not same(peak[0], inner[0]) or not same_dim(peak[1], total[1]):
        return None
    return m.call("{F}.log_softmax({x}, dim={d})", x=inner[0], d=total[1])


def gelu(m: Matcher, node: ast.AST) -> ast.expr | None:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))) and 0.5 * x * (1 + erf(x / sqrt(2)))."""
    factors = _factors(node)
    constants = [f for f in factors if const_value(f, m.aliases) is not None]
    others = [f for f in factors if const_value(f, m.aliases) is None]
    if len(constants) != 1 or not m.const_is(constants[0], 0.5) or len(others) != 2:
        return None
    for x, bracket in (others, others[::-1]):
        for one, inner in commuted(bracket, ast.Add):
            if not m.const_is(one, 1.0):
                continue
            erf = m.op(inner, "erf")
            if erf and _scaled(m, erf.args[0], x, 1 / math.sqrt(2)):
                return m.call("{F}.gelu({x})", x=x)
            tanh = m.op(inner, "tanh")
            if tanh and _tanh_gelu_arg(m, tanh.args[0], x):
                return m.call("{F}.gelu({x}, approximate='tanh')", x=x)
    return None


def _factors(node: ast.AST) -> list[ast.expr]:
    pair = binop(node, ast.Mult)
    return _factors(pair[0]) + _factors(pair[1]) if pair else [node]  # type: ignore[list-item]


def _scaled(m: Matcher, node: ast.AST, x: ast.expr, scale: float) -> bool:
    """node == x * scale (as x * c, c * x or x / (1/c))."""
    for a, b in commuted(node, ast.Mult):
        if same(a, x) and m.const_is(b, scale):
            return True
    pair = binop(node, ast.Div)
    value = const_value(pair[1], m.aliases) if pair else None
    return bool(pair and value and same(pair[0], x) and abs(1 / value - scale) < TOLERANCE)


def _tanh_gelu_arg(m: Matcher, node: ast.AST, x: ast.expr) -> bool:
    for c, poly in commuted(node, ast.Mult):
        if not m.const_is(c, math.sqrt(2 / math.pi)):
            continue
        for a, cubic in commuted(poly, ast.Add):
            if same(a, x) and any(m.const_is(k, 0.044715) and _cube(m, t, x) for k, t in commuted(cubic, ast.Mult)):
                return True
    return False


def _cube(m: Matcher, node: ast.AST, x: ast.expr) -> bool:
    pow_ = m.op(node, "pow")
    if pow_ and len(pow_.args) == 2 and same(pow_.args[0], x) and m.const_is(pow_.args[1], 3):
        return True
    pair = binop(node, ast.Pow)
    if pair and same(pair[0], x) and m.const_is(pair[1], 3):
        return True
    return _factors(node) == [x] * 3 or all(same(f, x) for f in _factors(node)) and len(_factors(node)) == 3


def _sigmoid_of(m: Matcher, node: ast.AST) -> ast.expr | None:
    """x for sigmoid(x) or 1 / (1 + exp(-x))."""
    sig = m.op(node, "sigmoid")
    if sig and len(sig.args) == 1:
        return sig.args[0]
    pair = binop(node, ast.Div)
    if pair and m.const_is(pair[0], 1.0):
        return _one_plus_exp_neg(m, pair[1])
    return None


def _one_plus_exp_neg(m: Matcher, node: ast.AST) -> ast.expr | None:
    for one, exp_node in commuted(node, ast.Add):
        exp = m.op(exp_node, "exp")
        if (
            m.const_is(one, 1.0)
            and exp
            and isinstance(exp.args[0], ast.UnaryOp)
            and isinstance(exp.args[0].op, ast.USub)
        ):
            return exp.args[0].operand
    return None


def silu(m: Matcher, node: ast.AST) -> ast.expr | None:
    for x, sig in commuted(node, ast.Mult):
        inner = _sigmoid_of(m, sig)
        if inner is not None and same(inner, x):
            return m.call("{F}.silu({x})", x=x)
    pair = binop(node, ast.Div)
    if pair:
        inner = _one_plus_exp_neg(m, pair[1])
        if inner is not None and same(inner, pair[0]):
            return m.call("{F}.silu({x})", x=pair[0])
    return None


def softplus(m: Matcher, node: ast.AST) -> ast.expr | None:
    log = m.op(node, "log", "log1p")
    if log is None or len(log.args) != 1:
        return None
    if log.name == "log1p":
        exp = m.op(log.args[0], "exp")
        return m.call("{F}.softplus({x})", x=exp.args[0]) if exp else None
    for one, exp_node in commuted(log.args[0], ast.Add):
        exp = m.op(exp_node, "exp")
        if m.const_is(one, 1.0) and exp:
            return m.call("{F}.softplus({x})", x=exp.args[0])
    return None


def mish(m: Matcher, node: ast.AST) -> ast.expr | None:
    for x, tanh_node in commuted(node, ast.Mult):
        tanh = m.op(tanh_node, "tanh")
        inner = m.op(tanh.args[0], "softplus") if tanh else None
        if inner and len(inner.args) == 1 and not inner.kwargs and same(inner.args[0], x):
            return m.call("{F}.mish({x})", x=x)
    return None


def variance(m: Matcher, node: ast.AST) -> ast.expr | None:
    """mean((x - mean(x, d, keepdim=True)) ** 2, d) -> torch.var(x, d, unbiased=False)."""
    outer = m.mean(node)
    if outer is None or outer[1] is None:
        return None
    centered = m.square(outer[0])
    pair = binop(centered, ast.Sub) if centered is not None else None
    if pair is None:
        return None
    inner = m.mean(pair[1])
    if inner is None or not same(inner[0], pair[0]) or not same_dim(inner[1], outer[1]) or not inner[2]:
        return None
    keep = "True" if outer[2] else "False"
    return m.call("torch.var({x}, dim={d}, keepdim=" + keep + ", unbiased=False)", x=pair[0], d=outer[1])


def _population_var(m: Matcher, node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    found = m.op(node, "var")
    if found is None or not found.args:
        return None
    unbiased = found.kwargs.get("unbiased")
    correction = found.kwargs.get("correction")
    keep = found.kwargs.get("keepdim")
    dim = found.kwargs.get("dim", found.args[1] if len(found.args) > 1 else None)
    population = (isinstance(unbiased, ast.Constant) and unbiased.value is False) or (
        correction is not None and m.const_is(correction, 0)
    )
    if not population or dim is None or not (isinstance(keep, ast.Constant) and keep.value is True):
        return None
    return found.args[0], dim


def _last_dims(m: Matcher, dim: ast.expr) -> int | None:
    """How many trailing dims `dim` names (-1 -> 1, (-2, -1) -> 2); None when it is not a trailing block."""
    values = (
        [const_value(e, m.aliases) for e in dim.elts]
        if isinstance(dim, ast.Tuple | ast.List)
        else [const_value(dim, m.aliases)]
    )
    if any(v is None for v in values):
        return None
    wanted = list(range(-len(values), 0))
    return len(values) if sorted(int(v) for v in values) == wanted else None  # type: ignore[arg-type]


def layer_norm(m: Matcher, node: ast.AST) -> ast.expr | None:
    """(x - mean) / sqrt(var + eps) or (x - mean) * rsqrt(var + eps), population var over trailing dims."""
    centered, scale, divide = None, None, False
    if (pair := binop(node, ast.Div)) is not None:
        centered, scale, divide = pair[0], m.op(pair[1], "sqrt"), True
    else:
        for a, b in commuted(node, ast.Mult):
            if m.op(b, "rsqrt"):
                centered, scale = a, m.op(b, "rsqrt")
    diff = binop(centered, ast.Sub) if centered is not None else None
    if diff is None or scale is None or not divide and scale.name != "rsqrt":
        return None
    mean = m.mean(diff[1])
    if mean is None or not same(mean[0], diff[0]) or not mean[2] or mean[1] is None:
        return None
    for var_node, eps in commuted(scale.args[0], ast.Add):
        var = _population_var(m, var_node) or _population_var(m, variance(m, var_node) or var_node)
        count = _last_dims(m, mean[1])
        if var and same(var[0], diff[0]) and same(var[1], mean[1]) and count:
            return m.call("{F}.layer_norm({x}, {x}.shape[-" + str(count) + ":], eps={eps})", x=diff[0], eps=eps)
    return None


def affine_layer_norm(m: Matcher, node: ast.AST) -> ast.expr | None:
    """layer_norm(x) * w + b with 1-D parameters w, b -> layer_norm(x, w.shape, w, b)."""
    for scaled, bias in commuted(node, ast.Add):
        for normed, weight in commuted(scaled, ast.Mult):
            ln = m.op(normed, "layer_norm")
            if (
                ln
                and len(ln.args) == 2
                and set(ln.kwargs) == {"eps"}
                and _vector_param(m, weight)
                and _vector_param(m, bias)
            ):
                return m.call(
                    "{F}.layer_norm({x}, {w}.shape, {w}, {b}, eps={eps})",
                    x=ln.args[0],
                    w=weight,
                    b=bias,
                    eps=ln.kwargs["eps"],
                )
    return None


def _vector_param(m: Matcher, node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and m.param_shapes.get(node.attr) == 1
    )


def rms_norm(m: Matcher, node: ast.AST) -> ast.expr | None:
    """x * rsqrt(mean(x*x, -1, keepdim=True) + eps) or x / sqrt(...) -> F.rms_norm; then * w folds the weight in."""
    for normed, weight in commuted(node, ast.Mult):
        rms = m.op(normed, "rms_norm")
        if rms and len(rms.args) == 2 and set(rms.kwargs) == {"eps"} and _vector_param(m, weight):
            return m.call(
                "{F}.rms_norm({x}, {w}.shape, {w}, eps={eps})", x=rms.args[0], w=weight, eps=rms.kwargs["eps"]
            )
    candidates = [(a, m.op(b, "rsqrt")) for a, b in commuted(node, ast.Mult)]
    if (pair := binop(node, ast.Div)) is not None:
        candidates.append((pair[0], m.op(pair[1], "sqrt")))
    for x, root in candidates:
        if root is None:
            continue
        for mean_node, eps in commuted(root.args[0], ast.Add):
            mean = m.mean(mean_node)
            squared = m.square(mean[0]) if mean else None
            if (
                mean
                and squared is not None
                and same(squared, x)
                and mean[2]
                and mean[1] is not None
                and _last_dims(m, mean[1]) == 1
                and const_value(eps, m.aliases) != 0
                and m.reduction(eps, "mean") is None
            ):
                return m.call("{F}.rms_norm({x}, {x}.shape[-1:], eps={eps})", x=x, eps=eps)
    return None


def mse(m: Matcher, node: ast.AST) -> ast.expr | None:
    mean = m.mean(node)
    if mean is None or mean[1] is not None:
        return None
    squared = m.square(mean[0])
    pair = binop(squared, ast.Sub) if squared is not None else None
    return m.call("{F}.mse_loss({a}, {b})", a=pair[0], b=pair[1]) if pair else None


def linear(m: Matcher, node: ast.AST) -> ast.expr | None:
    """matmul(x, W.t()) (+ b) with a 2-D parameter W -> F.linear(x, W, b)."""
    # the second loop also tries `node` itself as the product, with no bias
    product: ast.AST
    bias: ast.expr | None
    for product, bias in commuted(node, ast.Add):
        done = m.op(product, "linear")
        if done and len(done.args) == 2 and not done.kwargs and _vector_param(m, bias):
            return m.call("{F}.linear({x}, {w}, {b})", x=done.args[0], w=done.args[1], b=bias)
    for product, bias in [*commuted(node, ast.Add), (node, None)]:
        mm = m.op(product, "matmul")
        if mm is None and (pair := binop(product, ast.MatMult)):
            mm = Op("matmul", [pair[0], pair[1]], {})
        if mm is None or len(mm.args) != 2:
            continue
        weight = _transposed(m, mm.args[1])
        if weight is None or not (isinstance(weight, ast.Attribute) and m.param_shapes.get(weight.attr) == 2):
            continue
        if bias is None:
            return m.call("{F}.linear({x}, {w})", x=mm.args[0], w=weight)
        if _vector_param(m, bias):
            return m.call("{F}.linear({x}, {w}, {b})", x=mm.args[0], w=weight, b=bias)
    return None


def _transposed(m: Matcher, node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        return node.value
    found = m.op(node, "t", "transpose")
    if found and (found.name == "t" or len(found.args) == 3):
        dims = sorted(const_value(a, m.aliases) or 0 for a in found.args[1:])
        if found.name == "t" or dims in ([-2, -1], [0, 1]):
            return found.args[0]
    return None


def attention(m: Matcher, node: ast.AST) -> ast.expr | None:
    """matmul(softmax(matmul(q, k.transpose(-2, -1)) / s, -1), v) -> F.scaled_dot_product_attention(q, k, v, scale=1/s)."""
    outer = m.op(node, "matmul")
    if outer is None or len(outer.args) != 2:
        return None
    soft = m.op(outer.args[0], "softmax")
    if soft is None:
        return None
    dim = soft.kwargs.get("dim", soft.args[1] if len(soft.args) > 1 else None)
    if dim is None or const_value(dim, m.aliases) != -1 or set(soft.kwargs) - {"dim"}:
        return None
    scores, scale = soft.args[0], None
    if (pair := binop(scores, ast.Div)) is not None:
        scores, scale = pair[0], m.call("1.0 / {s}", s=pair[1])
    else:
        for a, b in commuted(scores, ast.Mult):
            if m.op(a, "matmul") is not None:
                scores, scale = a, b
    inner = m.op(scores, "matmul")
    if inner is None or len(inner.args) != 2 or scale is None:
        return None
    key = m.op(inner.args[1], "transpose")
    if key is None or len(key.args) != 3 or sorted(const_value(a, m.aliases) or 0 for a in key.args[1:]) != [-2, -1]:
        return None
    return m.call(
        "{F}.scaled_dot_product_attention({q}, {k}, {v}, scale={s})",
        q=inner.args[0],
        k=key.args[0],
        v=outer.args[1],
        s=scale,
    )


def vector_norm(m: Matcher, node: ast.AST) -> ast.expr | None:
    root = m.op(node, "sqrt")
    total = m.reduction(root.args[0], "sum") if root else None
    squared = m.square(total[0]) if total else None
    if total is None or squared is None or total[1] is None:
        return None
    keep = "True" if total[2] else "False"
    return m.call("torch.linalg.vector_norm({x}, dim={d}, keepdim=" + keep + ")", x=squared, d=total[1])


# Tried bottom-up at every node, in this order; inner rewrites (variance, softplus) feed outer ones.
PATTERNS: tuple[tuple[str, Callable[[Matcher, ast.AST], ast.expr | None]], ...] = (
    ("softmax", softmax),
    ("log_softmax", log_softmax),
    ("variance", variance),
    ("layer_norm", layer_norm),
    ("layer_norm", affine_layer_norm),
    ("rms_norm", rms_norm),
    ("gelu", gelu),
    ("silu", silu),
    ("softplus", softplus),
    ("mish", mish),
    ("mse_loss", mse),
    ("linear", linear),
    ("attention", attention),
    ("vector_norm", vector_norm),
)
