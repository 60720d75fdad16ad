"""hoist_constants: work in forward that does not depend on the inputs moves out of the per-call path.

Constants (torch.arange/ones/tril/..., math on them, masks) become buffers built once in `__init__`
(`register_buffer(..., persistent=False)`, so `.to(device)` moves them). Values derived from parameters
(`self.weight.t().contiguous()`) become a cached method, recomputed when the parameter changes (its version
counter or storage moves) and never cached while autograd records (the cache would hold a stale graph).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from services.implementer.rules.astutil import (
    body_function,
    canonical,
    definitions,
    dotted,
    drop_dead,
    from_ssa,
    is_impure,
    loads,
    method,
    param_names,
    parse_function,
    parse_stmts,
    visit_expr,
)
from services.implementer.rules.base import Context
from services.implementer.rules.ewir import scalar_attributes

GLOBAL_OK = frozenset(
    {"torch", "math", "F", "nn", "float", "int", "len", "range", "min", "max", "abs", "tuple", "list"}
)
VIEW_OPS = frozenset(
    {
        "t",
        "T",
        "mT",
        "transpose",
        "view",
        "reshape",
        "unsqueeze",
        "squeeze",
        "permute",
        "expand",
        "flatten",
        "contiguous_view",
        "detach",
    }
)

CACHED = '''
def {name}(self):
    """{what}, cached until a parameter it reads changes."""
    if torch.is_grad_enabled():
        return self.{name}_compute()
    key = ({key},)
    cached = self.__dict__.get("{name}_cache")
    if cached is None or cached[0] != key:
        cached = (key, self.{name}_compute())
        self.__dict__["{name}_cache"] = cached
    return cached[1]
'''


@dataclass
class Hoist:
    name: str
    expr: ast.expr  # in terms of constant locals of forward
    needs: list[ast.stmt]  # the constant statements it depends on, in order
    state: list[str]  # parameter expressions it reads (self.weight, self.linear.weight)
    cast_to: ast.expr | None  # `x.dtype` when the constant was built in the input's dtype


class _Analysis:
    def __init__(self, ctx: Context, func: ast.FunctionDef) -> None:
        self.ctx = ctx
        self.inputs = set(param_names(func))
        self.scalars = {f"self.{a}" for a in scalar_attributes(method(ctx.cls, "__init__"))}
        self.defs = definitions(func)
        self.constant: dict[str, ast.stmt] = {}
        self.locals = {n for s in func.body for n in _targets(s)}
        for stmt in func.body:
            targets = _targets(stmt)
            if isinstance(stmt, ast.Assign) and len(targets) == 1 and self.is_constant(stmt.value):
                self.constant[targets[0]] = stmt

    def is_constant(self, node: ast.AST) -> bool:
        if is_impure(node) or isinstance(node, ast.Starred):
            return False
        for sub in _walk_skipping_placement(node, self.inputs):
            if isinstance(sub, ast.Attribute) and dotted(sub) and dotted(sub).startswith("self."):  # type: ignore[union-attr]
                continue
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                if sub.id in self.inputs or (sub.id in self.locals and sub.id not in self.constant):
                    return False
                if (
                    sub.id not in self.locals
                    and sub.id not in GLOBAL_OK
                    and sub.id not in self.ctx.aliases
                    and sub.id != "self"
                ):
                    return False
        return not any(isinstance(s, ast.Call) and _self_call(s) for s in ast.walk(node))

    def worth(self, node: ast.AST) -> bool:
        """Has tensor work beyond a view of a parameter: a torch call or a tensor method that is not a view."""
        for sub in ast.walk(self.expand(node)):
            if not isinstance(sub, ast.Call):
                continue
            name = canonical(sub.func, self.ctx.aliases) or ""
            if name.startswith("torch."):
                return True
            module_call = name.split(".")[0] in set(self.ctx.aliases.values()) | {"math"}
            if isinstance(sub.func, ast.Attribute) and not module_call and sub.func.attr not in VIEW_OPS:
                return True
        return False

    def expand(self, node: ast.AST) -> ast.AST:
        """`node` with constant locals substituted (for inspection only)."""
        consts = {n: s.value for n, s in self.constant.items()}  # type: ignore[attr-defined]

        class Expand(ast.NodeTransformer):
            def visit_Name(self, name: ast.Name) -> ast.AST:
                return self.visit(copy.deepcopy(consts[name.id])) if name.id in consts else name

        return Expand().visit(copy.deepcopy(node))

    def state(self, node: ast.AST) -> list[str]:
        found: list[str] = []
        for sub in ast.walk(self.expand(node)):
            text = dotted(sub) if isinstance(sub, ast.Attribute) else None
            if text and text.startswith("self.") and text not in self.scalars and not text.startswith("self.__"):
                if not any(text.startswith(other + ".") for other in found) and text not in found:
                    found = [f for f in found if not f.startswith(text + ".")] + [text]
        return found

    def needs(self, node: ast.AST) -> list[ast.stmt]:
        wanted: set[str] = set()
        frontier = loads(node)
        while frontier:
            name = frontier.pop()
            if name in self.constant and name not in wanted:
                wanted.add(name)
                frontier |= loads(self.constant[name].value)  # type: ignore[attr-defined]
        return [s for n, s in self.constant.items() if n in wanted]


def _targets(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        return [n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _self_call(call: ast.Call) -> bool:
    """self.submodule(...) runs a layer: never treated as constant."""
    name = dotted(call.func) or ""
    return name.startswith("self.") and name.count(".") == 1


def _walk_skipping_placement(node: ast.AST, inputs: set[str]):
    """ast.walk, but `device=x.device` / `dtype=x.dtype` keyword values do not count as reading the input."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if isinstance(child, ast.keyword) and _placement_of_input(child, inputs):
                continue
            stack.append(child)


def _placement_of_input(keyword: ast.keyword, inputs: set[str]) -> bool:
    value = keyword.value
    return (
        keyword.arg in ("device", "dtype")
        and isinstance(value, ast.Attribute)
        and value.attr == keyword.arg
        and isinstance(value.value, ast.Name)
        and value.value.id in inputs
    )


def _strip_placement(stmts: list[ast.stmt], inputs: set[str]) -> ast.expr | None:
    """Drop `device=x.device` (buffers follow the module) and build in the default dtype instead of `x.dtype`."""
    cast: ast.expr | None = None
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                kept = []
                for keyword in node.keywords:
                    if _placement_of_input(keyword, inputs):
                        if keyword.arg == "dtype":
                            cast = copy.deepcopy(keyword.value)
                            keyword.value = ast.parse("torch.get_default_dtype()", mode="eval").body
                            kept.append(keyword)
                        continue
                    kept.append(keyword)
                node.keywords = kept
    return cast


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.mapping.get(node.id, node.id)
        return node


class HoistConstants:
    example = "Hoist the constant tensors out of forward and precompute them once in __init__."
    name = "hoist_constants"
    summary = (
        "input-independent work in forward (constant tensors, masks, tables, parameter transposes) moves to "
        "__init__ buffers or a parameter-versioned cache"
    )
    triggers: tuple[str, ...] = (
        r"\bhoist",
        r"pre-?comput",
        r"\bcache\b.*\b(constant|mask|table|weight|transpose)",
        r"(constant|mask|table|transpose)s?\b.*\b(once|__init__|constructor|init\b)",
        r"loop[- ]invariant",
        r"compute (it |them )?once",
        r"constant (folding|work|tensors?)",
        r"move .* (to|into) (the )?(__init__|init|constructor)",
        r"(re)?built (on )?every (call|forward)",
        r"redundant (constant|mask|allocation)",
    )

    def _plan(self, ctx: Context) -> tuple[ast.FunctionDef, list[Hoist]] | None:
        func = ctx.ssa_forward("analysed")
        if func is None:
            return None
        analysis = _Analysis(ctx, func)
        taken = {n.attr for n in ast.walk(ctx.cls) if isinstance(n, ast.Attribute)} | {
            n.name for n in ctx.cls.body if isinstance(n, ast.FunctionDef)
        }
        hoists: list[Hoist] = []

        class Replace(ast.NodeTransformer):
            def visit(self, node: ast.AST) -> ast.AST:
                if isinstance(node, ast.expr) and analysis.is_constant(node) and analysis.worth(node):
                    return self.hoist(node)
                return super().visit(node)

            def hoist(self, node: ast.expr) -> ast.expr:
                base = f"_hoisted_{node.id}" if isinstance(node, ast.Name) else f"_hoisted_{len(hoists)}"
                name, counter = base, 1
                while name in taken:
                    name, counter = f"{base}_{counter}", counter + 1
                taken.add(name)
                needs, expr = copy.deepcopy(analysis.needs(node)), copy.deepcopy(node)
                cast = _strip_placement([*needs, ast.Expr(expr)], analysis.inputs)
                mapping = {t: f"{t}_const" for s in needs for t in _targets(s)}
                needs = [_Renamer(mapping).visit(s) for s in needs]
                expr = _Renamer(mapping).visit(expr)
                hoists.append(Hoist(name, expr, needs, analysis.state(node), cast))
                use = ast.parse(f"self.{name}()" if hoists[-1].state else f"self.{name}", mode="eval").body
                return ast.Call(ast.Attribute(use, "to", ast.Load()), [cast], []) if cast is not None else use

        replacer = Replace()
        for stmt in func.body:
            if stmt in analysis.constant.values() or not isinstance(stmt, ast.Assign | ast.Return | ast.Expr):
                continue
            if stmt.value is not None:
                stmt.value = visit_expr(replacer, stmt.value)
        if not hoists:
            ctx.skip("forward has no input-independent tensor work to hoist")
            return None
        drop_dead(func)
        return func, hoists

    def applies(self, tree: ast.Module, ctx: Context) -> bool:
        return self._plan(ctx) is not None

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        plan = self._plan(ctx)
        assert plan is not None
        func, hoists = plan
        init = method(ctx.cls, "__init__")
        if init is None:
            init = parse_function("def __init__(self):\n    super().__init__()")
            ctx.cls.body.insert(0, init)
        target = body_function(ctx.cls)
        assert target is not None  # _plan worked on it
        for hoist in hoists:
            expr = ast.unparse(hoist.expr)
            if not hoist.state:
                init.body += [
                    *hoist.needs,
                    *parse_stmts(f"self.register_buffer({hoist.name!r}, {expr}, persistent=False)"),
                ]
                continue
            key = ", ".join(f"{s}._version, {s}.data_ptr()" for s in hoist.state)
            cached = parse_stmts(CACHED.format(name=hoist.name, key=key, what=expr[:80].replace('"', "'")))[0]
            compute = parse_function(f"def {hoist.name}_compute(self):\n    return {expr}")
            compute.body[:0] = hoist.needs
            position = ctx.cls.body.index(target) + 1
            ctx.cls.body[position:position] = [cached, compute]
        target.body = from_ssa(func).body
        return tree
