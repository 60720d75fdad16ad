"""Checks on reference and candidate sources by reading their syntax tree; nothing here imports or runs them."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

REFERENCE_NAMES = ("Model", "get_inputs", "get_init_inputs")
# Calls that build a custom kernel: C++/CUDA through torch.utils.cpp_extension, or Triton.
KERNEL_BUILDERS = frozenset({"load_inline", "load", "jit", "autotune", "compile_kernel", "_compile_kernel"})
KERNEL_MODULES = ("torch.utils.cpp_extension", "triton", "torch.cuda")


@dataclass
class CandidateCheck:
    """What the syntax tree says about a candidate before it runs."""

    syntax_error: str | None = None
    defines_model_new: bool = False
    flags: list[str] = field(default_factory=list)


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def reference_problems(source: str) -> list[str]:
    """Why `source` is not a usable KernelBench reference; empty when it is."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"reference_source has a syntax error: {exc.msg} (line {exc.lineno})"]
    missing = [name for name in REFERENCE_NAMES if name not in top_level_names(tree)]
    return [f"reference_source does not define {', '.join(missing)}"] if missing else []


def check_candidate(source: str, require_custom_kernel: bool) -> CandidateCheck:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return CandidateCheck(
            syntax_error=f"SyntaxError: {exc.msg} (line {exc.lineno}, offset {exc.offset})\n{(exc.text or '').rstrip()}"
        )
    check = CandidateCheck(defines_model_new=_binds_anywhere(tree, "ModelNew"))
    if _uses_reference_model(tree):
        check.flags.append("uses_reference_model")
    if _has_try_fallback(tree):
        check.flags.append("try_except_fallback")
    if require_custom_kernel and not _builds_custom_kernel(tree):
        check.flags.append("no_custom_kernel")
    return check


def _binds_anywhere(tree: ast.Module, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name) == name:
            return True
    return False


def _uses_reference_model(tree: ast.Module) -> bool:
    """The candidate reaches for the reference `Model` instead of its own code.

    Fires on importing `Model` or anything from a module named like the reference, and on reading a `Model`
    the candidate does not define itself (subclassing, calling, `globals()['Model']`, `module.Model`).
    """
    defines_model = any(isinstance(n, ast.ClassDef) and n.name == "Model" for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if "reference" in (node.module or "") or any(a.name == "Model" for a in node.names):
                return True
        elif isinstance(node, ast.Import):
            if any("reference" in alias.name for alias in node.names):
                return True
        elif not defines_model and (
            (isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load))
            or (isinstance(node, ast.Attribute) and node.attr == "Model")
            or (isinstance(node, ast.Constant) and node.value in ("Model", "reference"))
        ):
            return True
    return False


def _has_try_fallback(tree: ast.Module) -> bool:
    """A `try` whose handler swallows the failure (does not re-raise): the classic fall-back-to-PyTorch path."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Try | ast.TryStar):
            for handler in node.handlers:
                if not any(isinstance(inner, ast.Raise) for inner in ast.walk(handler)):
                    return True
    return False


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _builds_custom_kernel(tree: ast.Module) -> bool:
    imports_kernel_module = any(
        (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(KERNEL_MODULES))
        or (isinstance(node, ast.Import) and any(a.name.startswith(KERNEL_MODULES) for a in node.names))
        for node in ast.walk(tree)
    )
    if not imports_kernel_module and "cpp_extension" not in ast.unparse(tree):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node.func) in KERNEL_BUILDERS:
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if _call_name(target) in KERNEL_BUILDERS:
                    return True
    return False
