"""The split build's reading of a CUDA source (split_build.py): tree-sitter's CUDA grammar, top-level items
classified as device, host or both, kernel launch sites and the host rewrites that replace them.

Nothing here guesses: what it does not fully understand raises `NotSplittable`, and the sources take the whole
build.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

TORCH_NAMESPACES = frozenset({"torch", "at", "c10", "pybind11", "py"})
TORCH_MACRO = re.compile(r"^(TORCH|AT|C10|CUDA_KERNEL_LAUNCH)_")
LIGHT_TYPES = frozenset({"at::Half", "c10::Half", "at::BFloat16", "c10::BFloat16"})
TORCH_INCLUDE = re.compile(r"^[<\"](torch|ATen|c10|pybind11)/")
# Headers and namespaces that exist for device code only (empty or broken under g++): device side alone.
DEVICE_INCLUDE = re.compile(r"^<(cooperative_groups|mma\.h|cuda_pipeline|cuda_awbarrier|sm_\d+_intrinsics)")
DEVICE_NAMESPACES = frozenset({"cooperative_groups", "nvcuda", "wmma"})
SYMBOL_CALLS = {
    "cudaMemcpyToSymbol": 0,
    "cudaMemcpyToSymbolAsync": 0,
    "cudaMemcpyFromSymbol": 1,
    "cudaMemcpyFromSymbolAsync": 1,
    "cudaGetSymbolAddress": 1,
    "cudaGetSymbolSize": 1,
}
# Runtime calls that take a kernel's address: host code may name a (non-template) kernel there, through an accessor.
FUNCTION_CALLS = {
    "cudaFuncSetAttribute": 0,
    "cudaFuncGetAttributes": 1,
    "cudaFuncSetCacheConfig": 0,
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor": 1,
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


class NotSplittable(Exception):
    """The splitter does not fully understand these sources; they take the whole build."""


@functools.cache
def _parser() -> Any:
    import tree_sitter_cuda
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_cuda.language()))


def text(node: Any) -> str:
    return str(node.text.decode("utf-8", "replace"))


def walk(node: Any) -> Iterator[Any]:
    """The node and its descendants in source order, without recursion (a candidate may nest 100,000 deep)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def names(node: Any) -> set[str]:
    return {text(n) for n in walk(node) if n.type in ("identifier", "type_identifier", "namespace_identifier")}


def mentions_torch(node: Any) -> bool:
    for n in walk(node):
        if n.type == "qualified_identifier" and text(n).replace(" ", "") in LIGHT_TYPES:
            continue
        if n.type == "namespace_identifier" and text(n) in TORCH_NAMESPACES:
            parent = n.parent
            if parent is None or text(parent).replace(" ", "") not in LIGHT_TYPES:
                return True
        if n.type == "identifier" and TORCH_MACRO.match(text(n)):
            return True
        # `using namespace torch;` names the namespace as a plain identifier.
        if n.type == "identifier" and text(n) in TORCH_NAMESPACES and n.parent is not None:
            if n.parent.type in ("using_declaration", "namespace_alias_definition"):
                return True
    return False


def parse(source: str) -> Any:
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
        found.add(text(child))
    return found


def declarator_name(node: Any) -> str | None:
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
        if declarator.type in ("qualified_identifier", "operator_name", "destructor_name"):
            return None
        declarator = declarator.child_by_field_name("declarator")
    return text(declarator) if declarator is not None else None


@dataclass
class Item:
    """One top-level construct of the CUDA source and the side(s) of the split it belongs to."""

    node: Any
    side: str  # "device", "host" or "both"
    defines: set[str]
    kernel: Any = None  # the function_definition of a __global__ kernel
    variable: bool = False  # a __constant__/__device__ variable
    suffix: str = ""  # the `;` after a top-level struct or enum, which the grammar leaves outside the node
    template: Any = None  # its template_parameter_list
    scope: tuple[str, ...] = ()  # the namespaces it sits in ("" for an anonymous one)

    def wrap(self, body: str) -> str:
        """`body` inside the item's namespaces, reopened for it alone (the same namespaces, so the same names)."""
        opening = "".join(f"namespace {name} {{\n" if name else "namespace {\n" for name in self.scope)
        return opening + body + "}\n" * len(self.scope)

    def qualified(self, name: str) -> str:
        """`name` as seen from the global scope (an anonymous namespace needs no qualifier)."""
        return "::".join([*(n for n in self.scope if n), name])


def classify(node: Any) -> Item:
    kind = node.type
    if kind == "comment":
        return Item(node, "none", set())
    if kind == "preproc_include":
        path = text(node.child_by_field_name("path"))
        if path.startswith('"'):
            raise NotSplittable(f"local include {path}")
        side = "host" if TORCH_INCLUDE.match(path) else "device" if DEVICE_INCLUDE.match(path) else "both"
        return Item(node, side, set())
    if kind in ("preproc_def", "preproc_function_def"):
        return Item(node, "both", {text(node.child_by_field_name("name"))})
    if kind == "preproc_call":
        return Item(node, "both", set())
    if kind == "preproc_ifdef":
        return _classify_guard(node)
    if kind in ("using_declaration", "namespace_alias_definition"):
        alias = {text(node.child_by_field_name("name"))} if kind == "namespace_alias_definition" else set()
        if names(node) & DEVICE_NAMESPACES:
            return Item(node, "device", alias)
        return Item(node, "host" if mentions_torch(node) else "both", alias)
    if kind in ("type_definition", "alias_declaration", "struct_specifier", "class_specifier", "enum_specifier"):
        return Item(node, "host" if mentions_torch(node) else "both", _type_names(node))
    if kind == "template_declaration":
        inner = [c for c in node.children if c.type not in ("template", "template_parameter_list")]
        if len(inner) != 1:
            raise NotSplittable("unexpected template declaration")
        item = classify(inner[0])
        item.node, item.template = node, node.child_by_field_name("parameters")
        if inner[0].type == "function_definition" and {"__host__", "__device__"} <= _specifiers(inner[0]):
            item.side = "both"  # a template may be defined in both files
        return item
    if kind == "function_definition":
        return _classify_function(node)
    if kind == "declaration":
        return _classify_declaration(node)
    raise NotSplittable(f"top-level {kind}")


def _classify_guard(node: Any) -> Item:
    """`#ifndef X / #define X ... / #endif` around macro definitions only: the same lines on both sides."""
    if node.child_by_field_name("alternative") is not None:
        raise NotSplittable("#else in a preprocessor conditional")
    name = node.child_by_field_name("name")
    body = [c for c in node.named_children if c.type != "comment" and (name is None or c != name)]
    if not body or any(c.type not in ("preproc_def", "preproc_function_def") for c in body):
        raise NotSplittable("a preprocessor conditional around code")
    return Item(node, "both", {text(c.child_by_field_name("name")) for c in body})


def _type_names(node: Any) -> set[str]:
    names = {text(n) for n in node.children if n.type == "type_identifier"}
    name = node.child_by_field_name("name")
    if name is not None:
        names.add(text(name))
    for child in node.children:
        if child.type in ("struct_specifier", "class_specifier", "enum_specifier"):
            names |= _type_names(child)
    return names


def _classify_function(node: Any) -> Item:
    name = declarator_name(node)
    if name is None:
        raise NotSplittable("a function with a qualified name")
    specifiers = _specifiers(node)
    if "__global__" in specifiers:
        return Item(node, "device", {name}, kernel=node)
    if {"__host__", "__device__"} <= specifiers and specifiers & {"inline", "__forceinline__", "static", "constexpr"}:
        return Item(node, "host" if mentions_torch(node) else "both", {name})
    if "__device__" in specifiers:
        return Item(node, "device", {name})
    return Item(node, "host", {name})


def declared_names(node: Any) -> set[str]:
    names = set()
    for declarator in node.children_by_field_name("declarator"):
        while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
            declarator = declarator.child_by_field_name("declarator")
        if declarator is not None:
            names.add(text(declarator))
    return names


def _classify_declaration(node: Any) -> Item:
    words = {text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
    words |= {c.type for c in node.children if c.type.startswith("__")}
    names = declared_names(node)
    if not names:
        raise NotSplittable("a declaration without a name")
    if words & {"__global__"}:
        return Item(node, "device", names)
    if words & {"__constant__", "__device__", "__shared__", "__managed__"}:
        return Item(node, "device", names, variable=not any(c.type == "function_declarator" for c in walk(node)))
    if any(c.type == "function_declarator" for c in walk(node)):
        return Item(node, "host", names)
    if words & {"const", "constexpr"} and not mentions_torch(node):
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
    if any(p.type != "parameter_declaration" or declarator_name(p) is None for p in params):
        raise NotSplittable("a kernel parameter with a default, a pack or no name")
    return params


def _template_names(kernel: Item) -> list[str]:
    if kernel.template is None:
        return []
    names = []
    for param in kernel.template.named_children:
        if param.type == "type_parameter_declaration":
            names.append(text(next(c for c in param.children if c.type == "type_identifier")))
        elif param.type == "parameter_declaration" and declarator_name(param):
            names.append(str(declarator_name(param)))
        elif param.type != "comment":
            raise NotSplittable(f"kernel template parameter {param.type}")
    return names


def _substituted(node: Any, mapping: dict[str, str]) -> str:
    """The text of `node` with identifiers in `mapping` replaced (template parameters by their arguments)."""
    edits = [
        (n.start_byte, n.end_byte, mapping[text(n)])
        for n in walk(node)
        if n.type in ("identifier", "type_identifier") and text(n) in mapping
    ]
    return apply_edits(node.text, node.start_byte, edits)


def apply_edits(data: bytes, base: int, edits: list[tuple[int, int, str]]) -> str:
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
        if callee is not None and text(callee).startswith("AT_DISPATCH_"):
            macro = text(callee)
            if macro not in DISPATCH_TYPES:
                raise NotSplittable(f"dispatch macro {macro}")
            types = DISPATCH_TYPES[macro]
            if macro.endswith(("_AND", "_AND2")):
                extra = list(node.child_by_field_name("arguments").named_children)[: 2 if "2" in macro else 1]
                for arg in extra:
                    last = re.split(r"[:.]", text(arg))[-1]
                    if last not in SCALAR_TYPES:
                        raise NotSplittable(f"dispatched type {text(arg)}")
                    types = (*types, SCALAR_TYPES[last])
            found.append(types)
        node = node.parent
    if len(found) > 1:
        raise NotSplittable("nested dispatch")
    return found[0] if found else ()


def _local_names(function: Any) -> set[str]:
    kinds = ("init_declarator", "parameter_declaration", "declaration", "alias_declaration", "type_definition")
    names = {str(declarator_name(n)) for n in walk(function) if n.type in kinds and declarator_name(n)}
    return names | {text(n.child_by_field_name("name")) for n in walk(function) if n.type == "alias_declaration"}


def find_launch(call: Any, kernels: dict[str, Item], function: Any, index: int) -> Launch:
    callee = call.child_by_field_name("function")
    if callee.type == "identifier":
        name, args = text(callee), []
    elif callee.type == "template_function":
        name = text(callee.child_by_field_name("name"))
        args = [text(a) for a in callee.child_by_field_name("arguments").named_children]
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
    used = set().union(*(names(a) for a in callee.child_by_field_name("arguments").named_children)) if args else set()
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
    return [_substituted(p, mapping) for p in params], [str(declarator_name(p)) for p in params]


def _tag(type_name: str) -> str:
    return type_name.replace("c10::", "").replace("_t", "")


LAUNCH_HEAD = "dim3 ka_grid, dim3 ka_block, size_t ka_shared, cudaStream_t ka_stream"


def launchers(launch: Launch) -> tuple[str, str]:
    """(device definitions, host declarations) of one launch site's launchers."""
    kernel_name = launch.kernel.qualified(str(declarator_name(launch.kernel.kernel)))
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


def launch_rewrite(launch: Launch) -> tuple[int, int, str]:
    syntax = next(c for c in launch.call.children if c.type == "kernel_call_syntax")
    config = [text(c) for c in syntax.named_children if c.type != "comment"]
    if not 2 <= len(config) <= 4:
        raise NotSplittable("a launch configuration of an unexpected length")
    config += ["0", "0"][: 4 - len(config)]
    arguments = launch.call.child_by_field_name("arguments")
    args = [text(a) for a in arguments.named_children if a.type != "comment"]
    if len(args) != len(_kernel_parameters(launch.kernel)):
        raise NotSplittable("a launch whose argument count differs from the kernel's parameters")
    target = f"ka_launch_{launch.index}<scalar_t>" if launch.types else f"ka_launch_{launch.index}"
    return launch.call.start_byte, launch.call.end_byte, f"{target}({', '.join([*config, *args])})"


PARAMETERS = frozenset({"parameter_declaration", "optional_parameter_declaration", "variadic_parameter_declaration"})


def _named(declarator: Any) -> Any:
    """The identifier a declarator names, through pointers, references, arrays, parentheses and functions; None for
    an abstract one."""
    while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
        inner = declarator.child_by_field_name("declarator")
        if inner is None and declarator.type in ("reference_declarator", "parenthesized_declarator"):
            inner = declarator.named_children[-1] if declarator.named_children else None
        declarator = inner
    return declarator


def signature(node: Any, name: str, alias: str, stop: Any = None) -> str:
    """The declaration of function `name` that `node` holds, as tokens (tokens), named `alias` and with the names of
    its parameters left out: one text for every function of one signature, so that they share a binding."""
    spans = lambda found: (found.start_byte, found.end_byte) if found is not None else None  # noqa: E731
    renamed = [spans(_named(d)) for d in node.children_by_field_name("declarator") if text(_named(d) or node) == name]
    dropped = {spans(_named(p.child_by_field_name("declarator"))) for p in walk(node) if p.type in PARAMETERS}
    end = stop.start_byte if stop is not None else node.end_byte
    leaves = [n for n in walk(node) if n.child_count == 0 and n.type != "comment" and n.end_byte <= end]
    words = [alias if spans(n) in renamed else text(n) for n in leaves if spans(n) not in dropped]
    return " ".join(word for word in words if word)


def tokens(node: Any, stop: Any = None) -> str:
    """The node's tokens (comments dropped) joined by single spaces: one text for one declaration however laid
    out, so equal declaration sets share a binding."""
    end = stop.start_byte if stop is not None else node.end_byte
    leaves = [n for n in walk(node) if n.child_count == 0 and n.type != "comment" and n.end_byte <= end]
    return " ".join(text(n) for n in leaves if text(n))


def check_references(items: list[Item], launches: list[Launch], symbols: list[Any]) -> None:
    device_names = set().union(*(i.defines for i in items if i.side == "device"))
    host_names = set().union(*(i.defines for i in items if i.side == "host"))
    allowed = [(n.start_byte, n.end_byte) for n in [launch.call.child_by_field_name("function") for launch in launches]]
    allowed += [(s.start_byte, s.end_byte) for s in symbols]
    for item in items:
        if item.side == "device":
            if mentions_torch(item.node):
                raise NotSplittable("device code that uses torch")
            if names(item.node) & host_names:
                raise NotSplittable("device code that names host code")
        elif item.side == "host":
            for node in walk(item.node):
                if node.type in ("identifier", "type_identifier") and text(node) in device_names:
                    if not any(start <= node.start_byte and node.end_byte <= end for start, end in allowed):
                        raise NotSplittable(f"host code names device symbol {text(node)}")


def symbol_uses(item: Item, wanted: set[str], calls: dict[str, int]) -> list[Any]:
    """The arguments of runtime `calls` (at their known position) that are plain names in `wanted`."""
    found = []
    for node in walk(item.node):
        callee = node.child_by_field_name("function") if node.type == "call_expression" else None
        if callee is None or text(callee) not in calls:
            continue
        args = node.child_by_field_name("arguments").named_children
        position = calls[text(callee)]
        if len(args) > position and args[position].type == "identifier" and text(args[position]) in wanted:
            found.append(args[position])
    return found


@dataclass
class Analysis:
    """The CUDA source's top-level items, its launch sites and uses of device variables, and the host rewrites."""

    items: list[Item]
    launches: list[Launch]
    symbols: list[Any]
    edits: dict[int, list[tuple[int, int, str]]]  # by id() of the host item
    kernel_refs: list[Any]  # kernels named in FUNCTION_CALLS


def analyse(source: str) -> Analysis:
    """Parse and classify the CUDA source; NotSplittable for anything not fully understood."""
    items = _items(parse(source).named_children, ())
    # Launchers are written after everything else, so a macro must mean one thing from its definition on.
    macros = [name for item in items if item.node.type in _MACRO_ITEMS for name in item.defines]
    if len(macros) != len(set(macros)):
        raise NotSplittable("a macro defined twice")
    if any(item.node.type == "preproc_call" and text(item.node).lstrip("# \t").startswith("undef") for item in items):
        raise NotSplittable("#undef")
    kernels = {}
    for item in items:
        if item.kernel is not None:
            name = str(declarator_name(item.kernel))
            if name in kernels:
                raise NotSplittable(f"kernel {name} defined twice")
            kernels[name] = item
    variables = set().union(*(i.defines for i in items if i.variable))
    launches: list[Launch] = []
    symbols: list[Any] = []
    kernel_refs: list[Any] = []
    edits: dict[int, list[tuple[int, int, str]]] = {}
    for item in items:
        if item.side != "host":
            continue
        if any(n.type in ("gnu_asm_expression", "asm_statement") for n in walk(item.node)):
            raise NotSplittable("inline assembly in host code")
        for node in walk(item.node):
            if node.type == "call_expression" and any(c.type == "kernel_call_syntax" for c in node.children):
                launch = find_launch(node, kernels, item.node, len(launches))
                launches.append(launch)
                edits.setdefault(id(item), []).append(launch_rewrite(launch))
        for symbol in symbol_uses(item, variables, SYMBOL_CALLS):
            symbols.append(symbol)
            rewrite = (symbol.start_byte, symbol.end_byte, f"ka_symbol_{text(symbol)}()")
            edits.setdefault(id(item), []).append(rewrite)
        plain_kernels = {name for name, kernel in kernels.items() if kernel.template is None}
        for reference in symbol_uses(item, plain_kernels, FUNCTION_CALLS):
            kernel_refs.append(reference)
            rewrite = (reference.start_byte, reference.end_byte, f"ka_kernel_{text(reference)}()")
            edits.setdefault(id(item), []).append(rewrite)
    if not launches:
        raise NotSplittable("no kernel launch in host code")
    check_references(items, launches, [*symbols, *kernel_refs])
    return Analysis(items, launches, symbols, edits, kernel_refs)


_MACRO_ITEMS = ("preproc_def", "preproc_function_def", "preproc_ifdef")


def _items(nodes: list[Any], scope: tuple[str, ...]) -> list[Item]:
    """The classified items of a list of top-level nodes, namespaces opened (their items keep the scope)."""
    found: list[Item] = []
    for node in nodes:
        if node.type == "namespace_definition":
            name = node.child_by_field_name("name")
            if name is not None and name.type != "namespace_identifier":
                raise NotSplittable("a nested namespace specifier")
            body = node.child_by_field_name("body")
            found += _items(body.named_children, (*scope, text(name) if name is not None else ""))
            continue
        item = classify(node)
        if item.side == "none":
            continue
        after = node.next_sibling
        item.suffix = ";" if after is not None and after.type == ";" else ""
        item.scope = scope
        found.append(item)
    return found
