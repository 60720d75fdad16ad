"""Split builds of `load_inline` CUDA extensions: device code without torch, host code against a PCH, a cached binding.

A whole `load_inline` build compiles the `.cu` file (kernels and the torch wrappers together) with nvcc, which
parses torch's headers three times, and `main.cpp` with the pybind11 bindings. A split build parses the sources
with tree-sitter (the CUDA grammar) and writes:

- `split_device.cu`: kernels, `__device__` functions and variables, the types and macros they use, and one
  `extern "C"` launcher per kernel launch site (one per dispatched type for a templated kernel launched with
  `scalar_t` inside `AT_DISPATCH_*`). No torch header, apart from c10's Half/BFloat16 where those types are used.
- `split_host.cpp`: the host code (the wrappers), each `kernel<<<...>>>(...)` replaced by a call of its launcher,
  compiled by g++ against a precompiled `torch/types.h` (pch.py).
- the binding: what `load_inline` generates from `functions=`, for the signatures the declarations of
  `cpp_sources` give (the functions' names and docstrings come from a table `split_host.cpp` ends with), compiled
  once per distinct signature list and flags into an object kept under `<cache>/split-bindings/`, with a module
  init of a fixed name; `split_stub.cpp` forwards the extension's own `PyInit_<name>` to it. It includes torch's
  pybind11 headers alone (BINDING_PRELUDE), against a PCH of its own.
- one link of the three objects and the binding.

split_source.py reads the CUDA source (items, launch sites, rewrites); this module checks the arguments, writes
the three sources and the binding, and compiles and links them.

Whatever the splitter does not fully understand (preprocessor conditionals around code, host code that names a
device symbol other than by launching it or through the `cudaMemcpy*Symbol` and `cudaFunc*` calls, a templated
kernel launched with arguments it cannot see through, flags that change how host code compiles, ...) raises
`NotSplittable`, and the caller builds whole. A split build that fails in any way is thrown away and the whole build decides.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.evaluator import pch, split_source
from services.evaluator.split_source import NotSplittable

log = logging.getLogger(__name__)

BINDING_INIT = "ka_split_binding"
HIDDEN = '__attribute__((visibility("hidden")))'
BINDING_DIR = "split-bindings"
# A split build that takes longer is abandoned for the whole build, which must still fit in the evaluation's time.
BUILD_TIMEOUT_S = 120
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
# The parts of a split build its ninja file compiles: split_<part>*.o objects, and the link of the library.
NINJA_PARTS = frozenset({"device", "host", "stub", "binding", "link"})
LIGHT_HEADERS = "#include <c10/util/Half.h>\n#include <c10/util/BFloat16.h>\n"
# The binding needs torch's pybind11 casters and error translation, not the C++ frontend torch/extension.h brings
# (torch/all.h: nn, optim, data): `torch::` names the ATen types the declarations use, as torch/types.h does.
BINDING_PRELUDE = f"#include <{pch.BINDING_HEADER}>\nnamespace torch {{\nusing namespace at;\n}}\n"


def enabled() -> bool:
    """`EVALUATOR_SPLIT_BUILD` (default on; `0`, `false`, `no` or `off` turn it off): try split builds. Read from the
    service's environment when a request is parsed and when the start-up PCH build runs; builders never see it."""
    return os.environ.get("EVALUATOR_SPLIT_BUILD", "").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class SplitPlan:
    device_source: str
    host_source: str
    binding_source: str
    launch_sites: int
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)


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


def _binding(cpp_sources: str, functions: dict[str, str], pytorch_errors: bool) -> tuple[str, str, str, set[str]]:
    """(binding source, the host code of cpp_sources, the host code's table of the bound functions, declared names).

    The binding is what load_inline's main.cpp holds, for the signatures alone: each bound function is declared
    under a name of its position with no parameter names (split_source.signature), reached through a pointer the
    table defines beside the host code, and bound under the name and docstring the table gives. Candidates whose
    functions have the same signatures (most take and return tensors) share one binding: the corpus's 48 split
    plans need 11 bindings, against 42 while the names were in them. The host code keeps every declaration, for
    definitions there (a wrapper calling a launcher of the .cu) need them."""
    if "PYBIND11" in cpp_sources or "TORCH_LIBRARY" in cpp_sources:
        raise NotSplittable("cpp_sources bind on their own")
    root = split_source.parse(cpp_sources)
    order = {name: index for index, name in enumerate(functions)}
    kept, definitions, declared = [], [], set()
    signatures: dict[str, str] = {}
    for node in root.named_children:
        if node.type == "comment":
            continue
        body = None
        if node.type in ("preproc_include", "preproc_def", "preproc_function_def", "preproc_call"):
            path = node.child_by_field_name("path") if node.type == "preproc_include" else None
            if path is not None and path.type != "system_lib_string":
                # Found from the build directory or through a macro: the binding, shared by every library of the
                # same text, would depend on the files beside the first one built.
                raise NotSplittable("an include in cpp_sources other than <...>")
            if split_source.text(node).strip() != "#include <torch/extension.h>":
                kept.append(split_source.text(node).strip() + "\n")
            definitions.append(split_source.text(node).strip() + "\n")
            continue
        if node.type in ("using_declaration", "alias_declaration", "type_definition"):
            kept.append(split_source.tokens(node) + "\n")
            definitions.append(split_source.text(node) + "\n")
            continue
        if node.type == "declaration" and any(c.type == "function_declarator" for c in split_source.walk(node)):
            names = split_source.declared_names(node)
        elif node.type == "function_definition" and split_source.declarator_name(node):
            names, body = {str(split_source.declarator_name(node))}, node.child_by_field_name("body")
        else:
            raise NotSplittable(f"cpp_sources with a top-level {node.type}")
        declared |= names
        definitions.append(split_source.text(node) + "\n")
        for name in sorted(names & set(functions)):
            if len(names) > 1:
                raise NotSplittable("a declaration of several functions, one of them bound")
            alias = f"ka_split_signature_{order[name]}"
            signature = split_source.signature(node, name, alias, stop=body).removesuffix(" ;") + " ;\n"
            if signatures.setdefault(name, signature) != signature:
                # load_inline's binding cannot take an overloaded name (or the split would pick one of them).
                raise NotSplittable("a bound function declared twice with other signatures")
    if set(functions) - declared:
        raise NotSplittable("a bound function cpp_sources do not declare")
    lines, module, table = [BINDING_PRELUDE, *kept], [f"PYBIND11_MODULE({BINDING_INIT}, m) {{\n"], []
    for index, name in enumerate(functions):
        pointer = f"ka_split_function_{index}"
        # Not const: torch::wrap_pybind_function takes no const function pointer. The table's pointer has the type
        # of the declaration as the host code reads it, so a function of another type (a signature the stripping of
        # names changed) does not compile; and the binding needs a function whose mangled name holds that type as
        # the binding reads it, which the table defines as the host code does, so the two readings must agree or
        # the library does not load. Either way the whole build decides.
        # Hidden: resolved when the library is linked, never by another library loaded before it.
        pointer_type = f"decltype(&ka_split_signature_{index})"
        checked = f"{HIDDEN} void ka_split_type_{index}({pointer_type})"
        lines += [signatures[name], f"extern {HIDDEN} {pointer_type} {pointer};\n{checked};\n"]
        lines.append(f"{HIDDEN} void (*ka_split_type_check_{index})({pointer_type}) = &ka_split_type_{index};\n")
        table += [signatures[name], f"extern {HIDDEN} {pointer_type} {pointer} = &{name};\n{checked} {{}}\n"]
        bound = f"torch::wrap_pybind_function({pointer})" if pytorch_errors else pointer
        module.append(f"m.def(ka_split_names[{index}], {bound}, ka_split_docs[{index}]);\n")
    # Written as load_inline writes them into main.cpp: a name or docstring it could not compile, this cannot either.
    for array, texts in (("ka_split_names", list(functions)), ("ka_split_docs", list(functions.values()))):
        lines.append(f"extern {HIDDEN} const char* const {array}[];\n")
        quoted = ", ".join(f'"{text}"' for text in texts)
        table.append(f"extern {HIDDEN} const char* const {array}[] = {{{quoted}}};\n")
    return "".join([*lines, *module, "}\n"]), "".join(definitions), "".join(table), declared


def make_plan(arguments: dict[str, Any]) -> SplitPlan:
    """Split a `load_inline` call's sources into device, host and binding sources; NotSplittable if unsure."""
    functions = _check_arguments(arguments)
    binding, cpp_definitions, table, _ = _binding(
        "\n".join(_as_list(arguments.get("cpp_sources"))), functions, arguments.get("with_pytorch_error_handling", True)
    )
    found = split_source.analyse("\n".join(_as_list(arguments.get("cuda_sources"))))
    items, launches, symbols, edits = found.items, found.launches, found.symbols, found.edits
    device, host = [DEVICE_PRELUDE], [HOST_PRELUDE, cpp_definitions]
    light = False
    announced: set[int] = set()
    exported: set[str] = set()
    definitions: list[str] = []
    # Accessors of the device symbols host code names: {prefix + name: the item that defines it}.
    accessors = {f"ka_symbol_{split_source.text(s)}": "&" for s in symbols}
    accessors.update({f"ka_kernel_{split_source.text(k)}": "" for k in found.kernel_refs})
    for item in items:
        text = split_source.text(item.node) + item.suffix + "\n"
        if item.side in ("device", "both"):
            device.append(item.wrap(text))
            light = light or bool(split_source.names(item.node) & {"Half", "BFloat16"})
        if item.side in ("host", "both"):
            rewritten = split_source.apply_edits(item.node.text, item.node.start_byte, edits.get(id(item), []))
            host.append(item.wrap(rewritten + item.suffix + "\n"))
        if item.side == "device":
            for launch in launches:
                kernel_name = str(split_source.declarator_name(launch.kernel.kernel))
                if kernel_name in item.defines and launch.index not in announced:
                    announced.add(launch.index)
                    host.append(split_source.launchers(launch)[1])
            for accessor, address_of in sorted(accessors.items()):
                name = accessor.split("_", 2)[2]
                if name in item.defines and accessor not in exported:
                    exported.add(accessor)
                    host.append(f'extern "C" const void* {accessor}();\n')
                    body = f"return (const void*){address_of}{item.qualified(name)};"
                    definitions.append(f'extern "C" const void* {accessor}() {{ {body} }}\n')
    for launch in launches:
        device.append(split_source.launchers(launch)[0])
        light = light or any(t.startswith("c10::") for t in launch.types)
    device += definitions
    host.append(table)  # after every definition of a bound function
    if light:
        device.insert(1, LIGHT_HEADERS)
    return SplitPlan(
        device_source="".join(device),
        host_source=_without_extension_include("".join(host)),
        binding_source=binding,
        launch_sites=len(launches),
        # Blank flags (candidates write extra_cflags=[""]) change nothing but the PCH lookup: dropped.
        extra_cflags=[f for f in _as_list(arguments.get("extra_cflags")) if f.strip()],
        extra_cuda_cflags=[f for f in _as_list(arguments.get("extra_cuda_cflags")) if f.strip()],
        extra_ldflags=[f for f in _as_list(arguments.get("extra_ldflags")) if f.strip()],
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


@functools.cache
def binding_salt(base_cflags: tuple[str, ...]) -> str:
    """The part of a binding's cache key that is not its source: compiler, Python, torch and CUDA versions and
    the evaluator's flags, from which torch derives the compile flags. Computed alike by the service (which must
    not open a CUDA context, so it never asks torch for the flags themselves) and the builder."""
    import platform
    import sys

    import torch

    identity = pch._compiler_identity(pch._compiler())
    versions = [platform.machine(), sys.version, torch.__version__, str(torch.version.cuda)]
    return "\0".join([identity, *versions, *base_cflags])


@functools.cache
def _binding_flags(base_cflags: tuple[str, ...]) -> tuple[str, ...]:
    cflags = pch._ninja_cflags(list(base_cflags), with_cuda=True)
    if cflags is None:
        raise NotSplittable("torch's build flags cannot be read")
    return tuple(cflags)


def binding_cflags(cache_dir: Path, base_cflags: list[str]) -> tuple[list[str], str]:
    """The binding's compile flags (the evaluator's own flags only: candidates' flags never reach it), with the
    binding's PCH where there is one, and its key's salt."""
    cflags = _binding_flags(tuple(base_cflags))
    header = pch.find_pch(cache_dir, base_cflags, header=pch.BINDING_HEADER)
    flags = [*cflags, f"-DTORCH_EXTENSION_NAME={BINDING_INIT}", *pch.pch_cflags(header)]
    return flags, binding_salt(tuple(base_cflags))


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
    stub = re.search(r"^build \S+: compile \S*split_stub\.cpp$", ninja, re.MULTILINE)
    if stub is None:
        raise NotSplittable("unexpected build.ninja")
    # The stub includes nothing: without the types.h PCH every other C++ file gets, it compiles in milliseconds, not
    # the 2 s (a third of a build's CPU time with the binding cached) that loading the PCH took on the H100 host.
    ninja = ninja.replace(stub.group(0), f"{stub.group(0)}\n  cflags = -fPIC -DTORCH_EXTENSION_NAME={name}")
    binding_object = _ninja_path(str(cached)) if cached is not None else f"split_binding_{key}.o"
    ninja = ninja.replace(link.group(0), f"{link.group(0)} {binding_object}")
    if cached is None:
        quoted = " ".join(_ninja_escape(f) for f in flags)
        source = _ninja_path(str(build_dir / "split_binding.cpp"))
        edge = f"build {binding_object}: compile {source}\n  cflags = {quoted}\n"
        ninja = ninja.replace(link.group(0), f"{edge}\n{link.group(0)}")
        objects.append(binding_object)
    (build_dir / "build.ninja").write_text(ninja)
    return objects, key


def _ninja_escape(flag: str) -> str:
    """A flag for a ninja variable that the shell reads: shell-quoted, `$` doubled for ninja."""
    import shlex

    return shlex.quote(flag).replace("$", "$$")


def _ninja_path(path: str) -> str:
    """A path in a ninja build line: `$`, spaces and colons escaped."""
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def run_ninja(build_dir: Path, targets: list[str], timeout_s: float = BUILD_TIMEOUT_S) -> None:
    command = ["ninja", "-v"]
    jobs = os.environ.get("MAX_JOBS")
    if jobs and jobs.isdigit():
        command += ["-j", jobs]
    # On SIGTERM ninja stops the compilers it started (each in a process group of its own); its session is the
    # backstop.
    process = subprocess.Popen(
        [*command, *targets], cwd=build_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        raise RuntimeError(f"split build took longer than {timeout_s} s") from error
    if process.returncode != 0:
        raise RuntimeError(f"split build failed:\n{stdout[-20000:]}{stderr[-5000:]}")


@dataclass
class SplitBuild:
    """What a split build left: the files in its directory, its binding's key, and the seconds of each part."""

    files: list[str]
    binding_key: str
    parts_s: dict[str, float]


def build(arguments: dict[str, Any], build_dir: Path, name: str, cache_dir: Path, base_cflags: list[str]) -> SplitBuild:
    """Split-build `load_inline(**arguments)` into `build_dir/<name>.so` without loading it.

    NotSplittable before anything is compiled, RuntimeError when a compile or the link fails: the caller then
    builds whole. A binding compiled here is left as `split_binding_<key>.o` for the service to publish (and is
    stored in the cache directly when the cache is writable, as it is for trusted callers)."""
    started = time.monotonic()
    plan = make_plan(arguments)
    _, key = write_ninja(plan, build_dir, name, cache_dir, base_cflags)
    parts = {"plan": time.monotonic() - started}
    run_ninja(build_dir, [])
    parts.update(ninja_part_seconds(build_dir))
    compiled = build_dir / f"split_binding_{key}.o"
    if compiled.is_file() and os.access(cache_dir, os.W_OK):
        with contextlib.suppress(OSError):
            store_binding(cache_dir, key, compiled.read_bytes())
    return SplitBuild([p.name for p in build_dir.iterdir() if p.is_file()], key, parts)


def ninja_part_seconds(build_dir: Path) -> dict[str, float]:
    """Seconds of each part of a split build (device, host, stub, binding, link), from the `.ninja_log` ninja
    keeps beside build.ninja: start and end milliseconds per output. The parts overlap (ninja runs them in
    parallel); a binding found in the cache is absent."""
    seconds: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in (build_dir / ".ninja_log").read_text().splitlines():
            fields = line.split("\t")
            if line.startswith("#") or len(fields) < 4 or not (fields[0].isdigit() and fields[1].isdigit()):
                continue
            output = Path(fields[3]).name
            part = "link" if output.endswith(".so") else output.split(".")[0].removeprefix("split_").split("_")[0]
            if part in NINJA_PARTS:
                seconds[part] = max(0, int(fields[1]) - int(fields[0])) / 1e3
    return seconds


def expected_binding(arguments: dict[str, Any], base_cflags: list[str]) -> str | None:
    """Service side: the key of the binding a split build of these arguments compiles, or None when the sources
    take the whole build (or the splitter cannot run here)."""
    try:
        plan = make_plan(arguments)
        return binding_key(plan.binding_source, binding_salt(tuple(base_cflags)))
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
