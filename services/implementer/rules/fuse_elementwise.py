"""fuse_elementwise: the longest element-wise chain of forward becomes ONE generated kernel.

target cuda: load_inline C++ (CPU tensors) and CUDA (CUDA tensors) builds, dispatched on `x.is_cuda`;
target triton: a Triton kernel with an eager fallback off CUDA; target torch: one fused Python expression.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from services.implementer.rules import ewcodegen as gen
from services.implementer.rules.astutil import (
    body_function,
    definitions,
    drop_dead,
    ensure_import,
    from_ssa,
    inline,
    method,
    parse_stmts,
)
from services.implementer.rules.base import Context
from services.implementer.rules.ewir import Node, Reader, depends_on_input, op_count, scalar_attributes

MIN_OPS = 2

CUDA_HELPER = '''
# `omp simd` (no OpenMP runtime needed) lets gcc vectorise the loop; errno-free math lets it inline sqrt.
_FUSED_{ID}_CFLAGS = ["-O3", "-fno-math-errno", "-fopenmp-simd"]
_fused_{id}_builds = {{}}


def _fused_{id}(x{params}):
    """One generated kernel for: {summary}"""
    device = "cuda" if x.is_cuda else "cpu"
    module = _fused_{id}_builds.get(device)
    if module is None:
        if device == "cuda":
            module = load_inline(name="ka_fused_{id}_cuda", cpp_sources=_FUSED_{ID}_DECL, cuda_sources=_FUSED_{ID}_CUDA,
                                 functions=["fused_forward"], extra_cuda_cflags=["-O3"])
        else:
            module = load_inline(name="ka_fused_{id}_cpu", cpp_sources=_FUSED_{ID}_CPP, functions=["fused_forward"],
                                 extra_cflags=_FUSED_{ID}_CFLAGS)
        _fused_{id}_builds[device] = module
    return module.fused_forward(x{floats})
'''

TRITON_IMPORT = """
import importlib.util

if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl
else:
    triton = None
"""

TRITON_HELPER = '''
if triton is not None:
{kernel}

def _fused_{id}(x{params}):
    """One Triton kernel for: {summary}"""
    if triton is None or not x.is_cuda:
        return {fallback}
    source = x.contiguous()
    out = torch.empty_like(source)
    n = source.numel()
    _fused_{id}_kernel[(triton.cdiv(n, 1024),)](source, out, n{floats}, BLOCK=1024)
    return out
'''


@dataclass
class Plan:
    func: ast.FunctionDef  # SSA copy of the body function
    index: int
    ir: Node
    root: str
    scalars: list[ast.expr]
    inlined: ast.expr


class FuseElementwise:
    example = "Fuse the chain of element-wise ops into one custom kernel."
    name = "fuse_elementwise"
    summary = (
        "the longest element-wise chain in forward becomes one generated kernel (C++/CUDA, Triton or one expression)"
    )
    triggers: tuple[str, ...] = (
        r"\bfus\w*\b[^.;]{0,40}\b(element[- ]?wise|point[- ]?wise|activations?|chain)",
        r"\b(element[- ]?wise|point[- ]?wise)\b[^.;]{0,40}\bfus",
        r"kernel fusion",
        r"(single|one) (custom |fused )?kernel",
        r"custom (cuda|c\+\+|triton) kernel",
        r"load_inline",
        r"\bfused kernel\b",
    )

    def _plan(self, ctx: Context) -> Plan | None:
        func = ctx.ssa_forward("fused")
        if func is None:
            return None
        scalar_attrs = scalar_attributes(method(ctx.cls, "__init__"))
        defs = definitions(func)
        ew_defs = {
            name: value for name, value in defs.items() if Reader(ctx.aliases, scalar_attrs).read(value) is not None
        }
        best: Plan | None = None
        for index, stmt in enumerate(func.body):
            if not isinstance(stmt, ast.Assign | ast.Return) or stmt.value is None:
                continue
            inlined = inline(stmt.value, ew_defs)
            reader = Reader(ctx.aliases, scalar_attrs)
            ir = reader.read(inlined)
            if ir is None or reader.root is None or not depends_on_input(ir) or op_count(ir) < MIN_OPS:
                continue
            if best is None or op_count(ir) >= op_count(best.ir):
                best = Plan(func, index, ir, reader.root, reader.scalars, inlined)
        if best is None:
            ctx.skip(f"forward has no chain of {MIN_OPS} or more element-wise ops on one tensor left to fuse")
        return best

    def applies(self, tree: ast.Module, ctx: Context) -> bool:
        return self._plan(ctx) is not None

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        plan = self._plan(ctx)
        assert plan is not None
        stmt = plan.func.body[plan.index]
        assert isinstance(stmt, ast.Assign | ast.Return)  # _plan only picks statements with a value
        if ctx.target == "torch":
            stmt.value = plan.inlined
        else:
            kernel = gen.kernel_id(plan.ir, ctx.target)
            helper = (
                self._cuda_helper(tree, plan, kernel)
                if ctx.target == "cuda"
                else self._triton_helper(tree, plan, kernel)
            )
            position = tree.body.index(ctx.cls)
            tree.body[position:position] = helper
            stmt.value = ast.Call(
                ast.Name(f"_fused_{kernel}", ast.Load()),
                [ast.Name(plan.root, ast.Load()), *copy.deepcopy(plan.scalars)],
                [],
            )
        drop_dead(plan.func)
        body_function(ctx.cls).body = from_ssa(plan.func).body  # type: ignore[union-attr]
        return tree

    def _cuda_helper(self, tree: ast.Module, plan: Plan, kernel: str) -> list[ast.stmt]:
        if not any(isinstance(n, ast.ImportFrom) and n.module == "torch.utils.cpp_extension" for n in tree.body):
            ensure_import(tree, "torch")
            index = max(i + 1 for i, n in enumerate(tree.body) if isinstance(n, ast.Import | ast.ImportFrom))
            tree.body.insert(index, parse_stmts("from torch.utils.cpp_extension import load_inline")[0])
        count = len(plan.scalars)
        sources = [
            ast.Assign([ast.Name(f"_FUSED_{kernel.upper()}_{suffix}", ast.Store())], ast.Constant(text))
            for suffix, text in (("CPP", gen.cpp_source(plan.ir, count)), ("CUDA", gen.cuda_source(plan.ir, count)))
        ]
        sources.append(
            ast.Assign(
                [ast.Name(f"_FUSED_{kernel.upper()}_DECL", ast.Store())], ast.Constant(gen.cuda_declaration(count))
            )
        )
        helper = CUDA_HELPER.format(
            id=kernel,
            ID=kernel.upper(),
            summary=_summary(plan),
            params="".join(f", s{i}" for i in range(count)),
            floats="".join(f", float(s{i})" for i in range(count)),
        )
        return [*sources, *parse_stmts(helper)]

    def _triton_helper(self, tree: ast.Module, plan: Plan, kernel: str) -> list[ast.stmt]:
        if not any(isinstance(n, ast.If) and "find_spec('triton')" in ast.unparse(n.test) for n in tree.body):
            index = max(i + 1 for i, n in enumerate(tree.body) if isinstance(n, ast.Import | ast.ImportFrom))
            tree.body[index:index] = parse_stmts(TRITON_IMPORT)
        count = len(plan.scalars)
        kernel_text = gen.triton_kernel(f"_fused_{kernel}_kernel", plan.ir, count)
        helper = TRITON_HELPER.format(
            id=kernel,
            summary=_summary(plan),
            kernel="\n".join("    " + line for line in kernel_text.splitlines()),
            fallback=ast.unparse(_fallback(plan)),
            params="".join(f", s{i}" for i in range(count)),
            floats="".join(f", float(s{i})" for i in range(count)),
        )
        return parse_stmts(helper)


def _summary(plan: Plan) -> str:
    text = ast.unparse(plan.inlined).replace('"', "'")
    return text if len(text) < 160 else text[:157] + "..."


def _fallback(plan: Plan) -> ast.expr:
    """The chain as one PyTorch expression of `x` and `s0..`: what the Triton helper runs off CUDA."""
    dumps = {ast.dump(node): index for index, node in enumerate(plan.scalars)}

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return ast.Name("x", ast.Load()) if node.id == plan.root else node

        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            index = dumps.get(ast.dump(node))
            return ast.Name(f"s{index}", ast.Load()) if index is not None else self.generic_visit(node)

    return Substitute().visit(copy.deepcopy(plan.inlined))
