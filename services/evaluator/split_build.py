"""Split builds of `load_inline` CUDA extensions: device code without torch, host code against a PCH, a cached binding.

A whole `load_inline` build compiles the `.cu` file (kernels and the torch wrappers together) with nvcc, which
parses torch's headers three times, and `main.cpp` with the pybind11 bindings. A split build parses the sources
with tree-sitter (the CUDA grammar) and writes:

- `split_device.cu`: kernels, `__device__` functions and variables, the types and macros they use, and one
  `extern "C"` launcher per kernel launch site (one per dispatched type for a templated kernel launched with
  `scalar_t` inside `AT_DISPATCH_*`). No torch header, apart from c10's Half/BFloat16 where those types are used.
- `split_host.cpp`: the host code (the wrappers), each `kernel<<<...>>>(...)` replaced by a call of its launcher,
  compiled by g++ against a precompiled `torch/types.h` (pch.py).
- the binding: what `load_inline` generates from `functions=`, for the declarations of `cpp_sources`, compiled
  once per distinct declaration text and flags into an object kept under `<cache>/split-bindings/`, with a module
  init of a fixed name; `split_stub.cpp` forwards the extension's own `PyInit_<name>` to it.
- one link of the three objects and the binding.

Whatever the splitter does not fully understand (preprocessor conditionals, namespaces, host code that names a
device symbol other than by launching it or through the `cudaMemcpy*Symbol` calls, a templated kernel launched
with arguments it cannot see through, flags that change how host code compiles, ...) raises `NotSplittable`, and
the caller builds whole. A split build that fails in any way is thrown away and the whole build decides.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BINDING_INIT = "ka_split_binding"
BINDING_DIR = "split-bindings"
BINDING_TIMEOUT_S = 600
TORCH_NAMESPACES = frozenset({"torch", "at", "c10", "pybind11", "py"})
TORCH_MACRO = re.compile(r"^(TORCH|AT|C10|CUDA_KERNEL_LAUNCH)_")
LIGHT_TYPES = frozenset({"at::Half", "c10::Half", "at::BFloat16", "c10::BFloat16"})
TORCH_INCLUDE = re.compile(r"^[<\"](torch|ATen|c10|pybind11)/")
SYMBOL_CALLS = {
    "cudaMemcpyToSymbol": 0,
    "cudaMemcpyToSymbolAsync": 0,
    "cudaMemcpyFromSymbol": 1,
    "cudaMemcpyFromSymbolAsync": 1,
    "cudaGetSymbolAddress": 1,
    "cudaGetSymbolSize": 1,
}
FLOATING = ("double", "float")
INTEGRAL = ("uint8_t", "int8_t", "int16_t", "int32_t", "int64_t")
DISPATCH_TYPES: dict[str, tuple[str, ...]] = {
    "AT_DISPATCH_FLOATING_TYPES": FLOATING,
    "AT_DISPATCH_FLOATING_TYPES_AND_HALF": (*FLOATING, "c10::Half"),
    "AT_DISPATCH_FLOATING_TYPES_AND": FLOATING,
    "AT_DISPATCH_FLOATING_TYPES_AND2": FLOATING,
    "AT_DISPATCH_REDUCED_FLOATING_TYPES": ("c10::Half", "c10::BFloat16"),
    "AT_DISPATCH_INTEGRAL_TYPES": INTEGRAL,
    "AT_DISPATCH_ALL_TYPES": (*INTEGRAL, *FLOATING),
}
SCALAR_TYPES = {"Half": "c10::Half", "kHalf": "c10::Half", "BFloat16": "c10::BFloat16", "kBFloat16": "c10::BFloat16"}
# Flags that act on device code only, or equally on every part of a split build; any other flag takes the whole
# build (a -D, -std or -I would reach the host code differently, and some flags run programs in the builder).
SAFE_CUDA_FLAG = re.compile(
    r"^(-O[0-3]|-?-use_fast_math|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda|-lineinfo|"
    r"-Xptxas=-v|-Xptxas=-O[0-3]|--ptxas-options=-v|-maxrregcount=\d+|--maxrregcount=\d+|--ftz=(true|false)|"
    r"--prec-div=(true|false)|--prec-sqrt=(true|false)|--fmad=(true|false)|-res-usage|--resource-usage|"
    r"-arch=(sm|compute)_\d+a?|--gpu-architecture=(sm|compute)_\d+a?|-w|-Wno-deprecated-gpu-targets)$"
)
SAFE_CFLAG = re.compile(r"^(-O[0-3]|-w|-std=c\+\+17)$")
SAFE_LDFLAG = re.compile(r"^-l(cublas|cublasLt|curand|cudart|cuda|cusparse|cusolver|cufft)$")
HOST_PRELUDE = """\
#define __CUDA_NO_HALF_OPERATORS__
#define __CUDA_NO_HALF_CONVERSIONS__
#define __CUDA_NO_BFLOAT16_CONVERSIONS__
#define __CUDA_NO_HALF2_OPERATORS__
#include <torch/types.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <type_traits>
"""
# What torch/types.h brought into the whole build's .cu that kernels commonly lean on.
DEVICE_PRELUDE = """\
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstddef>
#include <cmath>
#include <cfloat>
#include <climits>
#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>
"""
LIGHT_HEADERS = "#include <c10/util/Half.h>\n#include <c10/util/BFloat16.h>\n"


class NotSplittable(Exception):
    """The splitter does not fully understand these sources; they take the whole build."""


@dataclass
class SplitPlan:
    device_source: str
    host_source: str
    binding_source: str
    launch_sites: int
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)


@functools.cache
def _parser() -> Any:
    import tree_sitter_cuda
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_cuda.language()))


def _text(node: Any) -> str:
    return str(node.text.decode("utf-8", "replace"))


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _names(node: Any) -> set[str]:
    return {_text(n) for n in _walk(node) if n.type in ("identifier", "type_identifier", "namespace_identifier")}


def _mentions_torch(node: Any) -> bool:
    for n in _walk(node):
        if n.type == "qualified_identifier" and _text(n).replace(" ", "") in LIGHT_TYPES:
            continue
        if n.type == "namespace_identifier" and _text(n) in TORCH_NAMESPACES:
            parent = n.parent
            if parent is None or _text(parent).replace(" ", "") not in LIGHT_TYPES:
                return True
        if n.type == "identifier" and TORCH_MACRO.match(_text(n)):
            return True
    return False


def _parse(source: str) -> Any:
    tree = _parser().parse(source.encode())
    if tree.root_node.has_error:
        raise NotSplittable("the parser does not accept the source")
    return tree.root_node


def _specifiers(function: Any) -> set[str]:
    """CUDA and storage specifiers before a function's declarator (__global__, __device__, inline, static...)."""
    found = set()
    for child in function.children:
        if child.type in ("function_declarator", "compound_statement"):
            break
        found.add(_text(child))
    return found


def _declarator_name(node: Any) -> str | None:
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
        if declarator.type in ("qualified_identifier", "operator_name", "destructor_name"):
            return None
        declarator = declarator.child_by_field_name("declarator")
    return _text(declarator) if declarator is not None else None


@dataclass
class Item:
    """One top-level construct of the CUDA source and the side(s) of the split it belongs to."""

    node: Any
    side: str  # "device", "host" or "both"
    defines: set[str]
    kernel: Any = None  # the function_definition of a __global__ kernel
    variable: bool = False  # a __constant__/__device__ variable
    template: Any = None  # its template_parameter_list


def _classify(node: Any) -> Item:
    kind = node.type
    if kind == "comment":
        return Item(node, "none", set())
    if kind == "preproc_include":
        path = _text(node.child_by_field_name("path"))
        if path.startswith('"'):
            raise NotSplittable(f"local include {path}")
        return Item(node, "host" if TORCH_INCLUDE.match(path) else "both", set())
    if kind in ("preproc_def", "preproc_function_def"):
        return Item(node, "both", {_text(node.child_by_field_name("name"))})
    if kind == "preproc_call":
        return Item(node, "both", set())
    if kind in ("using_declaration", "namespace_alias_definition"):
        return Item(node, "host" if _mentions_torch(node) else "both", set())
    if kind in ("type_definition", "alias_declaration", "struct_specifier", "class_specifier", "enum_specifier"):
        return Item(node, "host" if _mentions_torch(node) else "both", _type_names(node))
    if kind == "template_declaration":
        inner = [c for c in node.children if c.type not in ("template", "template_parameter_list")]
        if len(inner) != 1:
            raise NotSplittable("unexpected template declaration")
        item = _classify(inner[0])
        item.node, item.template = node, node.child_by_field_name("parameters")
        if inner[0].type == "function_definition" and {"__host__", "__device__"} <= _specifiers(inner[0]):
            item.side = "both"  # a template may be defined in both files
        return item
    if kind == "function_definition":
        return _classify_function(node)
    if kind == "declaration":
        return _classify_declaration(node)
    raise NotSplittable(f"top-level {kind}")


def _type_names(node: Any) -> set[str]:
    names = {_text(n) for n in node.children if n.type == "type_identifier"}
    name = node.child_by_field_name("name")
    if name is not None:
        names.add(_text(name))
    for child in node.children:
        if child.type in ("struct_specifier", "class_specifier", "enum_specifier"):
            names |= _type_names(child)
    return names


def _classify_function(node: Any) -> Item:
    name = _declarator_name(node)
    if name is None:
        raise NotSplittable("a function with a qualified name")
    specifiers = _specifiers(node)
    if "__global__" in specifiers:
        return Item(node, "device", {name}, kernel=node)
    if {"__host__", "__device__"} <= specifiers and specifiers & {"inline", "__forceinline__", "static", "constexpr"}:
        return Item(node, "host" if _mentions_torch(node) else "both", {name})
    if "__device__" in specifiers:
        return Item(node, "device", {name})
    return Item(node, "host", {name})


def _declared_names(node: Any) -> set[str]:
    names = set()
    for declarator in node.children_by_field_name("declarator"):
        while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
            declarator = declarator.child_by_field_name("declarator")
        if declarator is not None:
            names.add(_text(declarator))
    return names


def _classify_declaration(node: Any) -> Item:
    words = {_text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
    words |= {c.type for c in node.children if c.type.startswith("__")}
    names = _declared_names(node)
    if not names:
        raise NotSplittable("a declaration without a name")
    if words & {"__global__"}:
        return Item(node, "device", names)
    if words & {"__constant__", "__device__", "__shared__", "__managed__"}:
        return Item(node, "device", names, variable=not any(c.type == "function_declarator" for c in _walk(node)))
    if any(c.type == "function_declarator" for c in _walk(node)):
        return Item(node, "host", names)
    if words & {"const", "constexpr"} and not _mentions_torch(node):
        return Item(node, "both", names)
    return Item(node, "host", names)


# Launch sites ---------------------------------------------------------------------------------------------------


@dataclass
class Launch:
    index: int
    kernel: Item
    call: Any
    template_args: list[str]  # the site's explicit template arguments, `scalar_t` for the dispatched type
    types: tuple[str, ...]  # the dispatched types, or () when the site names no dispatched type


def _kernel_parameters(kernel: Item) -> list[Any]:
    declarator = kernel.kernel.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        raise NotSplittable("a kernel without a parameter list")
    params = [c for c in declarator.child_by_field_name("parameters").children if c.is_named and c.type != "comment"]
    if any(p.type != "parameter_declaration" or _declarator_name(p) is None for p in params):
        raise NotSplittable("a kernel parameter with a default, a pack or no name")
    return params


def _template_names(kernel: Item) -> list[str]:
    if kernel.template is None:
        return []
    names = []
    for param in kernel.template.named_children:
        if param.type == "type_parameter_declaration":
            names.append(_text(next(c for c in param.children if c.type == "type_identifier")))
        elif param.type == "parameter_declaration" and _declarator_name(param):
            names.append(str(_declarator_name(param)))
        elif param.type != "comment":
            raise NotSplittable(f"kernel template parameter {param.type}")
    return names


def _substituted(node: Any, mapping: dict[str, str]) -> str:
    """The text of `node` with identifiers in `mapping` replaced (template parameters by their arguments)."""
    edits = [
        (n.start_byte, n.end_byte, mapping[_text(n)])
        for n in _walk(node)
        if n.type in ("identifier", "type_identifier") and _text(n) in mapping
    ]
    return _apply(node.text, node.start_byte, edits)


def _apply(data: bytes, base: int, edits: list[tuple[int, int, str]]) -> str:
    out, cursor = [], base
    for start, end, replacement in sorted(edits):
        if start < cursor:
            raise NotSplittable("overlapping rewrites")
        out += [data[cursor - base : start - base].decode(), replacement]
        cursor = end
    out.append(data[cursor - base :].decode())
    return "".join(out)


def _dispatch_of(call: Any, function: Any) -> tuple[str, ...]:
    """The types an enclosing AT_DISPATCH_* macro binds `scalar_t` to; () outside one."""
    found: list[tuple[str, ...]] = []
    node = call.parent
    while node is not None and node != function:
        if node.type == "template_declaration":
            raise NotSplittable("a launch inside a host template")
        callee = node.child_by_field_name("function") if node.type == "call_expression" else None
        if callee is not None and _text(callee).startswith("AT_DISPATCH_"):
            macro = _text(callee)
            if macro not in DISPATCH_TYPES:
                raise NotSplittable(f"dispatch macro {macro}")
            types = DISPATCH_TYPES[macro]
            if macro.endswith(("_AND", "_AND2")):
                extra = list(node.child_by_field_name("arguments").named_children)[: 2 if "2" in macro else 1]
                for arg in extra:
                    last = re.split(r"[:.]", _text(arg))[-1]
                    if last not in SCALAR_TYPES:
                        raise NotSplittable(f"dispatched type {_text(arg)}")
                    types = (*types, SCALAR_TYPES[last])
            found.append(types)
        node = node.parent
    if len(found) > 1:
        raise NotSplittable("nested dispatch")
    return found[0] if found else ()


def _local_names(function: Any) -> set[str]:
    kinds = ("init_declarator", "parameter_declaration", "declaration", "alias_declaration", "type_definition")
    names = {str(_declarator_name(n)) for n in _walk(function) if n.type in kinds and _declarator_name(n)}
    return names | {_text(n.child_by_field_name("name")) for n in _walk(function) if n.type == "alias_declaration"}


def _find_launch(call: Any, kernels: dict[str, Item], function: Any, index: int) -> Launch:
    callee = call.child_by_field_name("function")
    if callee.type == "identifier":
        name, args = _text(callee), []
    elif callee.type == "template_function":
        name = _text(callee.child_by_field_name("name"))
        args = [_text(a) for a in callee.child_by_field_name("arguments").named_children]
    else:
        raise NotSplittable("a launch of something other than a kernel name")
    if function.type == "template_declaration":
        raise NotSplittable("a launch inside a host template")
    kernel = kernels.get(name)
    if kernel is None:
        raise NotSplittable(f"a launch of {name}, which is not a kernel of this source")
    if len(args) != len(_template_names(kernel)):
        raise NotSplittable(f"a launch of {name} without all its template arguments")
    types = _dispatch_of(call, function)
    used = set().union(*(_names(a) for a in callee.child_by_field_name("arguments").named_children)) if args else set()
    if "scalar_t" in used and not types:
        raise NotSplittable("scalar_t outside a dispatch")
    if (used - {"scalar_t"}) & _local_names(function):
        raise NotSplittable("a template argument names a local of the host function")
    return Launch(index, kernel, call, args, types if "scalar_t" in used else ())


def _launcher_params(launch: Launch, scalar: str | None) -> tuple[list[str], list[str]]:
    """(declarations, names) of the kernel's parameters for one instantiation."""
    mapping = {}
    for name, arg in zip(_template_names(launch.kernel), launch.template_args, strict=True):
        mapping[name] = re.sub(r"\bscalar_t\b", scalar, arg) if scalar else arg
    params = _kernel_parameters(launch.kernel)
    return [_substituted(p, mapping) for p in params], [str(_declarator_name(p)) for p in params]


def _tag(type_name: str) -> str:
    return type_name.replace("c10::", "").replace("_t", "")


LAUNCH_HEAD = "dim3 ka_grid, dim3 ka_block, size_t ka_shared, cudaStream_t ka_stream"


def _launchers(launch: Launch) -> tuple[str, str]:
    """(device definitions, host declarations) of one launch site's launchers."""
    kernel_name = _declarator_name(launch.kernel.kernel)
    device, host = [], []
    for scalar in launch.types or (None,):
        decls, names = _launcher_params(launch, scalar)
        suffix = f"_{_tag(scalar)}" if scalar else ""
        targs = ", ".join(re.sub(r"\bscalar_t\b", scalar, a) if scalar else a for a in launch.template_args)
        instance = f"{kernel_name}<{targs}>" if launch.template_args else kernel_name
        signature = f'extern "C" void ka_launch_{launch.index}{suffix}({", ".join([LAUNCH_HEAD, *decls])})'
        device.append(
            f"{signature} {{\n  {instance}<<<ka_grid, ka_block, ka_shared, ka_stream>>>({', '.join(names)});\n}}\n"
        )
        host.append(signature + ";\n")
    if launch.types:
        decls, names = _launcher_params(launch, "ka_scalar_t")
        call_args = ", ".join(["ka_grid, ka_block, ka_shared, ka_stream", *names])
        branches = "\n  else ".join(
            f"if constexpr (std::is_same_v<ka_scalar_t, {t}>) ka_launch_{launch.index}_{_tag(t)}({call_args});"
            for t in launch.types
        )
        host.append(
            f"template <typename ka_scalar_t>\ninline void ka_launch_{launch.index}({', '.join([LAUNCH_HEAD, *decls])}) {{\n"
            f'  {branches}\n  else static_assert(sizeof(ka_scalar_t) == 0, "type not dispatched");\n}}\n'
        )
    return "".join(device), "".join(host)


def _launch_rewrite(launch: Launch) -> tuple[int, int, str]:
    syntax = next(c for c in launch.call.children if c.type == "kernel_call_syntax")
    config = [_text(c) for c in syntax.named_children if c.type != "comment"]
    if not 2 <= len(config) <= 4:
        raise NotSplittable("a launch configuration of an unexpected length")
    config += ["0", "0"][: 4 - len(config)]
    arguments = launch.call.child_by_field_name("arguments")
    args = [_text(a) for a in arguments.named_children if a.type != "comment"]
    if len(args) != len(_kernel_parameters(launch.kernel)):
        raise NotSplittable("a launch whose argument count differs from the kernel's parameters")
    target = f"ka_launch_{launch.index}<scalar_t>" if launch.types else f"ka_launch_{launch.index}"
    return launch.call.start_byte, launch.call.end_byte, f"{target}({', '.join([*config, *args])})"


# The plan -------------------------------------------------------------------------------------------------------


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _check_arguments(arguments: dict[str, Any]) -> dict[str, str]:
    """The bound functions ({name: docstring}); NotSplittable for any argument the split does not reproduce."""
    functions = arguments.get("functions")
    if not _as_list(arguments.get("cuda_sources")) or not functions:
        raise NotSplittable("no CUDA sources or no functions to bind")
    if arguments.get("is_python_module", True) is not True or arguments.get("no_implicit_headers"):
        raise NotSplittable("not a plain python module")
    if arguments.get("sycl_sources") or arguments.get("extra_include_paths") or arguments.get("use_pch"):
        raise NotSplittable("include paths, SYCL or torch's own PCH")
    if arguments.get("with_cuda") is False:
        raise NotSplittable("with_cuda=False")
    for name, allowed in (("extra_cflags", SAFE_CFLAG), ("extra_cuda_cflags", SAFE_CUDA_FLAG)):
        for flag in _as_list(arguments.get(name)):
            if flag.strip() and not allowed.match(flag.strip()):
                raise NotSplittable(f"flag {flag!r}")
    for flag in _as_list(arguments.get("extra_ldflags")):
        if flag.strip() and not SAFE_LDFLAG.match(flag.strip()):
            raise NotSplittable(f"flag {flag!r}")
    if isinstance(functions, str):
        functions = [functions]
    named = dict(functions) if isinstance(functions, dict) else {f: f for f in functions}
    if not all(
        isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[A-Za-z_]\w*", k) for k, v in named.items()
    ):
        raise NotSplittable("unexpected function names")
    return named


def _binding(cpp_sources: str, functions: dict[str, str], pytorch_errors: bool) -> tuple[str, str, set[str]]:
    """(binding source, host definitions from cpp_sources, declared names): what load_inline's main.cpp holds."""
    if "PYBIND11" in cpp_sources or "TORCH_LIBRARY" in cpp_sources:
        raise NotSplittable("cpp_sources bind on their own")
    root = _parse(cpp_sources)
    kept, definitions, declared = [], [], set()
    for node in root.named_children:
        if node.type == "comment":
            continue
        if node.type in ("preproc_include", "preproc_def", "preproc_function_def", "preproc_call"):
            if _text(node).strip() != "#include <torch/extension.h>":
                kept.append(_text(node).strip() + "\n")
            definitions.append(_text(node).strip() + "\n")
        elif node.type in ("using_declaration", "alias_declaration", "type_definition"):
            kept.append(_tokens(node) + "\n")
            definitions.append(_text(node) + "\n")
        elif node.type == "declaration" and any(c.type == "function_declarator" for c in _walk(node)):
            declared |= _declared_names(node)
            kept.append(_tokens(node) + "\n")
        elif node.type == "function_definition" and _declarator_name(node):
            declared.add(str(_declarator_name(node)))
            kept.append(_tokens(node, stop=node.child_by_field_name("body")) + " ;\n")
            definitions.append(_text(node) + "\n")
        else:
            raise NotSplittable(f"cpp_sources with a top-level {node.type}")
    if set(functions) - declared:
        raise NotSplittable("a bound function cpp_sources do not declare")
    lines = ["#include <torch/extension.h>\n", *kept, f"PYBIND11_MODULE({BINDING_INIT}, m) {{\n"]
    for name, doc in functions.items():
        bound = f"torch::wrap_pybind_function({name})" if pytorch_errors else name
        lines.append(f'm.def("{name}", {bound}, "{doc}");\n')
    return "".join([*lines, "}\n"]), "".join(definitions), declared


def _tokens(node: Any, stop: Any = None) -> str:
    """The node's tokens (comments dropped) joined by single spaces: one text for one declaration however laid
    out, so equal declaration sets share a binding."""
    end = stop.start_byte if stop is not None else node.end_byte
    leaves = [n for n in _walk(node) if n.child_count == 0 and n.type != "comment" and n.end_byte <= end]
    return " ".join(_text(n) for n in leaves if _text(n))


def _check_references(items: list[Item], launches: list[Launch], symbols: list[Any]) -> None:
    device_names = set().union(*(i.defines for i in items if i.side == "device"))
    host_names = set().union(*(i.defines for i in items if i.side == "host"))
    allowed = [(n.start_byte, n.end_byte) for n in [launch.call.child_by_field_name("function") for launch in launches]]
    allowed += [(s.start_byte, s.end_byte) for s in symbols]
    for item in items:
        if item.side == "device":
            if _mentions_torch(item.node):
                raise NotSplittable("device code that uses torch")
            if _names(item.node) & host_names:
                raise NotSplittable("device code that names host code")
        elif item.side == "host":
            for node in _walk(item.node):
                if node.type in ("identifier", "type_identifier") and _text(node) in device_names:
                    if not any(start <= node.start_byte and node.end_byte <= end for start, end in allowed):
                        raise NotSplittable(f"host code names device symbol {_text(node)}")


def _symbol_uses(item: Item, variables: set[str]) -> list[Any]:
    found = []
    for node in _walk(item.node):
        callee = node.child_by_field_name("function") if node.type == "call_expression" else None
        if callee is None or _text(callee) not in SYMBOL_CALLS:
            continue
        args = node.child_by_field_name("arguments").named_children
        position = SYMBOL_CALLS[_text(callee)]
        if len(args) > position and args[position].type == "identifier" and _text(args[position]) in variables:
            found.append(args[position])
    return found


def make_plan(arguments: dict[str, Any]) -> SplitPlan:
    """Split a `load_inline` call's sources into device, host and binding sources; NotSplittable if unsure."""
    functions = _check_arguments(arguments)
    binding, cpp_definitions, _ = _binding(
        "\n".join(_as_list(arguments.get("cpp_sources"))), functions, arguments.get("with_pytorch_error_handling", True)
    )
    source = "\n".join(_as_list(arguments.get("cuda_sources")))
    root = _parse(source)
    items = [item for item in (_classify(node) for node in root.named_children) if item.side != "none"]
    kernels = {}
    for item in items:
        if item.kernel is not None:
            name = str(_declarator_name(item.kernel))
            if name in kernels:
                raise NotSplittable(f"kernel {name} defined twice")
            kernels[name] = item
    variables = set().union(*(i.defines for i in items if i.variable))
    launches: list[Launch] = []
    symbols: list[Any] = []
    edits: dict[int, list[tuple[int, int, str]]] = {}
    for item in items:
        if item.side != "host":
            continue
        if any(n.type in ("gnu_asm_expression", "asm_statement") for n in _walk(item.node)):
            raise NotSplittable("inline assembly in host code")
        for node in _walk(item.node):
            if node.type == "call_expression" and any(c.type == "kernel_call_syntax" for c in node.children):
                launch = _find_launch(node, kernels, item.node, len(launches))
                launches.append(launch)
                edits.setdefault(id(item), []).append(_launch_rewrite(launch))
        for symbol in _symbol_uses(item, variables):
            symbols.append(symbol)
            edits.setdefault(id(item), []).append((symbol.start_byte, symbol.end_byte, f"ka_symbol_{_text(symbol)}()"))
    if not launches:
        raise NotSplittable("no kernel launch in host code")
    _check_references(items, launches, symbols)
    device, host = [DEVICE_PRELUDE], [HOST_PRELUDE, cpp_definitions]
    light = False
    announced: set[int] = set()
    exported: set[str] = set()
    for item in items:
        text = _text(item.node) + "\n"
        if item.side in ("device", "both"):
            device.append(text)
            light = light or bool(_names(item.node) & {"Half", "BFloat16"})
        if item.side in ("host", "both"):
            host.append(_apply(item.node.text, item.node.start_byte, edits.get(id(item), [])) + "\n")
        if item.side == "device":
            for launch in launches:
                kernel_name = str(_declarator_name(launch.kernel.kernel))
                if kernel_name in item.defines and launch.index not in announced:
                    announced.add(launch.index)
                    host.append(_launchers(launch)[1])
            for name in sorted(item.defines & {_text(s) for s in symbols} - exported):
                exported.add(name)
                host.append(f'extern "C" const void* ka_symbol_{name}();\n')
    for launch in launches:
        device.append(_launchers(launch)[0])
        light = light or any(t.startswith("c10::") for t in launch.types)
    for name in sorted({_text(s) for s in symbols}):
        device.append(f'extern "C" const void* ka_symbol_{name}() {{ return (const void*)&{name}; }}\n')
    if light:
        device.insert(1, LIGHT_HEADERS)
    return SplitPlan(
        device_source="".join(device),
        host_source=_without_extension_include("".join(host)),
        binding_source=binding,
        launch_sites=len(launches),
        extra_cflags=_as_list(arguments.get("extra_cflags")),
        extra_cuda_cflags=_as_list(arguments.get("extra_cuda_cflags")),
        extra_ldflags=_as_list(arguments.get("extra_ldflags")),
    )


def _without_extension_include(text: str) -> str:
    return re.sub(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/extension\.h[>\"][^\n]*$", "", text, flags=re.MULTILINE)


# Compile and link -----------------------------------------------------------------------------------------------

STUB_SOURCE = f"""\
extern "C" void* PyInit_{BINDING_INIT}();
#define KA_CAT2(a, b) a##b
#define KA_CAT(a, b) KA_CAT2(a, b)
extern "C" __attribute__((visibility("default"))) void* KA_CAT(PyInit_, TORCH_EXTENSION_NAME)() {{
  return PyInit_{BINDING_INIT}();
}}
"""
BINDING_NAME = re.compile(r"^split_binding_([0-9a-f]{64})\.o$")


@functools.cache
def binding_salt(base_cflags: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The part of a binding's cache key that is not its source (compiler, flags, torch and CUDA versions), and
    its compile flags without the PCH (the evaluator's own flags only: candidates' flags never reach it)."""
    import torch

    from services.evaluator import pch

    cflags = pch._ninja_cflags(list(base_cflags), with_cuda=True)
    if cflags is None:
        raise NotSplittable("torch's build flags cannot be read")
    identity = pch._compiler_identity(pch._compiler())
    return "\0".join([identity, torch.__version__, str(torch.version.cuda), *cflags]), tuple(cflags)


def binding_cflags(cache_dir: Path, base_cflags: list[str]) -> tuple[list[str], str]:
    """The binding's compile flags, with the torch/extension.h PCH where there is one, and its key's salt."""
    from services.evaluator import pch

    salt, cflags = binding_salt(tuple(base_cflags))
    header = pch.find_pch(cache_dir, base_cflags)
    return [*cflags, f"-DTORCH_EXTENSION_NAME={BINDING_INIT}", *pch.pch_cflags(header)], salt


def binding_key(binding_source: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}\0{binding_source}".encode()).hexdigest()


def cached_binding(cache_dir: Path, key: str) -> Path | None:
    path = cache_dir / BINDING_DIR / f"{key}.o"
    return path if path.is_file() else None


def store_binding(cache_dir: Path, key: str, data: bytes) -> None:
    """Publish a binding object under its key, atomically; the first one stored stays."""
    target = cache_dir / BINDING_DIR / f"{key}.o"
    if target.exists():
        return
    target.parent.mkdir(exist_ok=True)
    os.chmod(target.parent, 0o755)
    fd, staging = tempfile.mkstemp(prefix=".staging-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(staging, 0o644)
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def write_ninja(
    plan: SplitPlan, build_dir: Path, name: str, cache_dir: Path, base_cflags: list[str]
) -> tuple[list[str], str]:
    """Write the sources and build.ninja into `build_dir`; (the object targets, the binding key)."""
    import inspect

    import torch.utils.cpp_extension as cpp_extension

    from services.evaluator import pch

    sources = {"split_host.cpp": plan.host_source, "split_device.cu": plan.device_source, "split_stub.cpp": STUB_SOURCE}
    for filename, text in sources.items():
        (build_dir / filename).write_text(text)
    (build_dir / "split_binding.cpp").write_text(plan.binding_source)
    cflags = [*plan.extra_cflags, *pch.pch_cflags(pch.find_pch(cache_dir, plan.extra_cflags, header=pch.TYPES_HEADER))]
    prepare = cpp_extension._prepare_ldflags
    wanted = {"extra_ldflags": list(plan.extra_ldflags), "with_cuda": True, "with_sycl": False, "verbose": False}
    wanted["is_standalone"] = False
    ldflags = prepare(**{k: v for k, v in wanted.items() if k in inspect.signature(prepare).parameters})
    writer = cpp_extension._write_ninja_file_to_build_library
    arguments = {
        "path": str(build_dir / "build.ninja"),
        "name": name,
        "sources": [str(build_dir / f) for f in sources],
        "extra_cflags": cflags,
        "extra_cuda_cflags": list(plan.extra_cuda_cflags),
        "extra_sycl_cflags": [],
        "extra_ldflags": ldflags,
        "extra_include_paths": [],
        "with_cuda": True,
        "with_sycl": False,
        "is_standalone": False,
    }
    accepted = inspect.signature(writer).parameters
    writer(**{k: v for k, v in arguments.items() if k in accepted})
    flags, salt = binding_cflags(cache_dir, base_cflags)
    key = binding_key(plan.binding_source, salt)
    cached = cached_binding(cache_dir, key)
    ninja = (build_dir / "build.ninja").read_text()
    link = re.search(rf"^build {re.escape(name)}\.so: link (.*)$", ninja, re.MULTILINE)
    if link is None:
        raise NotSplittable("unexpected build.ninja")
    objects = link.group(1).split()
    binding_object = str(cached) if cached is not None else f"split_binding_{key}.o"
    ninja = ninja.replace(link.group(0), f"{link.group(0)} {binding_object}")
    if cached is None:
        quoted = " ".join(_ninja_escape(f) for f in flags)
        edge = f"build {binding_object}: compile {build_dir / 'split_binding.cpp'}\n  cflags = {quoted}\n"
        ninja = ninja.replace(link.group(0), f"{edge}\n{link.group(0)}")
        objects.append(binding_object)
    (build_dir / "build.ninja").write_text(ninja)
    return objects, key


def _ninja_escape(flag: str) -> str:
    import shlex

    return shlex.quote(flag).replace("$", "$$")


def run_ninja(build_dir: Path, targets: list[str], timeout_s: float = BINDING_TIMEOUT_S) -> None:
    command = ["ninja", "-v"]
    jobs = os.environ.get("MAX_JOBS")
    if jobs and jobs.isdigit():
        command += ["-j", jobs]
    done = subprocess.run(
        [*command, *targets], cwd=build_dir, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"split build failed:\n{done.stdout[-20000:]}{done.stderr[-5000:]}")


def build(
    arguments: dict[str, Any], build_dir: Path, name: str, cache_dir: Path, base_cflags: list[str]
) -> tuple[list[str], str]:
    """Split-build `load_inline(**arguments)` into `build_dir/<name>.so` without loading it; (the files in
    `build_dir`, the binding's key).

    NotSplittable before anything is compiled, RuntimeError when a compile or the link fails: the caller then
    builds whole. A binding compiled here is left as `split_binding_<key>.o` for the service to publish (and is
    stored in the cache directly when the cache is writable, as it is for trusted callers)."""
    plan = make_plan(arguments)
    _, key = write_ninja(plan, build_dir, name, cache_dir, base_cflags)
    run_ninja(build_dir, [])
    compiled = build_dir / f"split_binding_{key}.o"
    if compiled.is_file() and os.access(cache_dir, os.W_OK):
        with contextlib.suppress(OSError):
            store_binding(cache_dir, key, compiled.read_bytes())
    return [p.name for p in build_dir.iterdir() if p.is_file()], key


def expected_binding(arguments: dict[str, Any], base_cflags: list[str]) -> str | None:
    """Service side: the key of the binding a split build of these arguments compiles, or None when the sources
    take the whole build (or the splitter cannot run here)."""
    try:
        plan = make_plan(arguments)
        return binding_key(plan.binding_source, binding_salt(tuple(base_cflags))[0])
    except NotSplittable as reason:
        log.info("whole build: %s", reason)
    except Exception:  # the splitter failing costs the split, never the build
        log.warning("split planning failed; whole build", exc_info=True)
    return None


def try_plan(arguments: dict[str, Any]) -> tuple[SplitPlan | None, str]:
    """The plan, or None and the reason these sources take the whole build."""
    try:
        return make_plan(arguments), ""
    except NotSplittable as reason:
        return None, str(reason)
