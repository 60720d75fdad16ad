"""AST helpers shared by the rewrite rules: names, the model class, straight-line forward bodies, SSA and inlining."""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterable

IMPL_METHOD = "_forward_impl"
# Calls whose removal would change the random stream or mutate state: never dropped as dead code.
IMPURE_MARKERS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "manual_seed", "print")


def parse_expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def parse_stmts(text: str) -> list[ast.stmt]:
    return ast.parse(text).body


def visit_expr(transformer: ast.NodeTransformer, node: ast.expr) -> ast.expr:
    """`transformer.visit(node)` for a transformer that only ever replaces an expression with an expression."""
    result = transformer.visit(node)
    assert isinstance(result, ast.expr)
    return result


def parse_function(text: str) -> ast.FunctionDef:
    """The function that `text` (one `def`) defines."""
    func = ast.parse(text).body[0]
    assert isinstance(func, ast.FunctionDef)
    return func


def dotted(node: ast.AST) -> str | None:
    """`torch.nn.functional.relu` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> module path for the module-level imports (`F` -> `torch.nn.functional`)."""
    aliases = {"torch": "torch", "math": "math"}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def canonical(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """Dotted name with the import alias resolved: `F.relu` -> `torch.nn.functional.relu`."""
    name = dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    if head in aliases:
        head = aliases[head]
    return f"{head}.{rest}" if rest else head


def functional_name(tree: ast.Module) -> str:
    """The local name of torch.nn.functional: an existing alias, else `F` (see `functional_alias`)."""
    for name, target in import_aliases(tree).items():
        if target == "torch.nn.functional":
            return name
    return "F"


def functional_alias(tree: ast.Module) -> str:
    """A name bound to torch.nn.functional, adding `import torch.nn.functional as F` when there is none."""
    for name, target in import_aliases(tree).items():
        if target == "torch.nn.functional":
            return name
    index = max((i + 1 for i, node in enumerate(tree.body) if isinstance(node, ast.Import | ast.ImportFrom)), default=0)
    tree.body.insert(index, ast.parse("import torch.nn.functional as F").body[0])
    return "F"


def ensure_import(tree: ast.Module, module: str) -> None:
    if not any(
        isinstance(n, ast.Import) and any(a.name == module and a.asname is None for a in n.names) for n in tree.body
    ):
        index = max((i + 1 for i, n in enumerate(tree.body) if isinstance(n, ast.Import | ast.ImportFrom)), default=0)
        tree.body.insert(index, ast.parse(f"import {module}").body[0])


def model_class(tree: ast.Module) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            return node
    return None


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def remove_method(cls: ast.ClassDef, name: str) -> None:
    cls.body = [n for n in cls.body if not (isinstance(n, ast.FunctionDef) and n.name == name)]


def body_function(cls: ast.ClassDef) -> ast.FunctionDef | None:
    """The method holding the model's computation: `_forward_impl` once wrappers exist, else `forward`."""
    return method(cls, IMPL_METHOD) or method(cls, "forward")


def param_names(func: ast.FunctionDef) -> list[str]:
    args = func.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if names and names[0] == "self" else names


def loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def target_names(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    names: list[str] = []
    for target in targets:
        names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return names


def is_straight_line(func: ast.FunctionDef) -> bool:
    """Only simple assignments to names, expression statements and a final return: safe to rename and inline."""
    for index, stmt in enumerate(func.body):
        if isinstance(stmt, ast.Return):
            if index != len(func.body) - 1:
                return False
        elif isinstance(stmt, ast.Assign):
            if not all(
                isinstance(t, ast.Name) or (isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts))
                for t in stmt.targets
            ):
                return False
        elif not isinstance(stmt, ast.Expr):
            return False
    scoped = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.NamedExpr)
    return not any(isinstance(n, scoped) for n in ast.walk(func))


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if isinstance(node.ctx, ast.Load) and node.id in self.mapping:
            return ast.copy_location(ast.Name(self.mapping[node.id], ast.Load()), node)
        return node


def to_ssa(func: ast.FunctionDef) -> bool:
    """Rename re-assigned locals (`x = x * 2` -> `x_1 = x * 2`) so every name has one definition; False if not straight-line.

    The renames are kept on the node (`func.ssa_bases`, new name -> original) for `from_ssa`.
    """
    if not is_straight_line(func):
        return False
    taken = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} | set(param_names(func))
    defined = set(param_names(func))
    mapping: dict[str, str] = {}
    bases: dict[str, str] = {}
    for stmt in func.body:
        # is_straight_line: every statement is an Assign, Expr or Return
        if isinstance(stmt, ast.Assign | ast.Expr | ast.Return) and stmt.value is not None:
            stmt.value = _Renamer(mapping).visit(stmt.value)
        for target in ast.walk(stmt) if isinstance(stmt, ast.Assign) else []:
            if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                new = target.id
                if target.id in defined:
                    counter = 1
                    while f"{target.id}_{counter}" in taken:
                        counter += 1
                    new = f"{target.id}_{counter}"
                    taken.add(new)
                    bases[new] = target.id
                defined.add(target.id)
                mapping[target.id] = new
                target.id = new
    func.ssa_bases = bases  # type: ignore[attr-defined]
    return True


def from_ssa(func: ast.FunctionDef) -> ast.FunctionDef:
    """Give SSA versions their original name back where no older value of that name is read later (readability)."""
    bases: dict[str, str] = getattr(func, "ssa_bases", {})
    holder = {base: base for base in set(bases.values())}  # which SSA name currently carries the original name
    renames: dict[str, str] = {}
    for index, stmt in enumerate(func.body):
        for name in target_names(stmt):
            base = bases.get(name)
            if base is None:
                continue
            later = set().union(*(loads(s) for s in func.body[index + 1 :]))
            if holder[base] not in later:
                renames[name] = base
                holder[base] = name
    if not renames:
        return func

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            node.id = renames.get(node.id, node.id)
            return node

    return Rename().visit(func)


def definitions(func: ast.FunctionDef) -> dict[str, ast.expr]:
    """Name -> value of the single-name assignments of an SSA body."""
    defs: dict[str, ast.expr] = {}
    for stmt in func.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            defs[stmt.targets[0].id] = stmt.value
    return defs


def inline(expr: ast.expr, defs: dict[str, ast.expr], keep: Iterable[str] = ()) -> ast.expr:
    """`expr` with the SSA definitions substituted in (names in `keep` stay)."""
    kept = set(keep)

    class Inliner(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if isinstance(node.ctx, ast.Load) and node.id in defs and node.id not in kept:
                return self.visit(copy.deepcopy(defs[node.id]))
            return node

    return Inliner().visit(copy.deepcopy(expr))


def same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def is_impure(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = dotted(sub.func) or ""
            last = name.rsplit(".", 1)[-1]
            if any(m in name for m in IMPURE_MARKERS) or (last.endswith("_") and not last.startswith("__")):
                return True
    return False


def drop_dead(func: ast.FunctionDef) -> None:
    """Remove assignments whose names are never read again (pure values only), until nothing changes."""
    changed = True
    while changed:
        changed = False
        for index, stmt in enumerate(func.body):
            if not isinstance(stmt, ast.Assign) or is_impure(stmt.value):
                continue
            later = set().union(*(loads(s) for s in func.body[index + 1 :])) if index + 1 < len(func.body) else set()
            if not set(target_names(stmt)) & later:
                del func.body[index]
                changed = True
                break


def const_value(node: ast.AST, aliases: dict[str, str]) -> float | None:
    """Numeric value of a literal expression (numbers, math constants and math functions of them), else None."""
    import math

    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = const_value(node.operand, aliases)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp):
        left, right = const_value(node.left, aliases), const_value(node.right, aliases)
        if left is None or right is None:
            return None
        ops = {
            ast.Add: lambda: left + right,
            ast.Sub: lambda: left - right,
            ast.Mult: lambda: left * right,
            ast.Div: lambda: left / right if right else None,
            ast.Pow: lambda: left**right if abs(right) < 64 else None,
        }
        fn = ops.get(type(node.op))
        try:
            return fn() if fn else None
        except (OverflowError, ZeroDivisionError, ValueError):
            return None
    name = canonical(node, aliases)
    if name in ("math.pi", "math.e"):
        return math.pi if name == "math.pi" else math.e
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        fname = canonical(node.func, aliases)
        arg = const_value(node.args[0], aliases)
        funcs = {"math.sqrt": math.sqrt, "math.log": math.log, "math.exp": math.exp, "float": float}
        if fname in funcs and arg is not None:
            try:
                return float(funcs[fname](arg))
            except (ValueError, OverflowError):
                return None
    return None


def _block_string(node: ast.stmt) -> tuple[str, str] | None:
    """(name, text) for `name = "<multi-line string>"` that can be written as a raw triple-quoted block, else None."""
    if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and "\n" in node.value.value
        and '"""' not in node.value.value
        and not node.value.value.endswith("\\")
    ):
        return node.targets[0].id, node.value.value
    return None


def render(tree: ast.Module, marker: str) -> str:
    """Module text: the marker comment, then each top-level statement; multi-line strings (kernel sources) stay readable."""
    parts: list[str] = []
    for node in tree.body:
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node is tree.body[0]
            and '"""' not in node.value.value
        ):
            text = f'"""{node.value.value}"""'
        elif (block := _block_string(node)) is not None:
            text = f'{block[0]} = r"""{block[1]}"""'
        else:
            text = ast.unparse(ast.fix_missing_locations(node))
        blank = "\n\n" if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.If | ast.Try) else ""
        parts.append(f"{blank}{text}{blank}")
    body = "\n".join(parts).replace("\n\n\n\n\n", "\n\n\n").replace("\n\n\n\n", "\n\n\n")
    return f"{marker}\n{body.strip()}\n"
