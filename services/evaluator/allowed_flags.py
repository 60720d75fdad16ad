"""Which compiler and linker flags a candidate's build may pass: an allow-list.

The builder compiles what a candidate asks for and must run nothing of the candidate's (docs/evaluator.md). A flag
can make the toolchain run another program or load code: a red-team candidate passed `extra_ldflags=["-wrapper",
"<python>,../sources/poly.cpp"]` (a file that is C++ and Python at once), and g++ ran its Python inside the builder
while linking. `-fplugin`, `-specs`, `-B`, response files (`@file`), `-Wl,-plugin`, nvcc's `-ccbin` and `--run` do
the same by other roads, so flags are matched against the shapes honest kernels use (optimisation, defines,
language standard, code generation, warnings, libraries and paths, nvcc's device options) and anything else is
refused with its name. Options handed on to another tool (`-Xcompiler`, `-Xptxas`, `-Xcudafe`, `-Wl,`) are
checked as that tool's, value by value.

torch writes the flags into build.ninja unquoted, and ninja runs each command through `/bin/sh -c`: a value with a
shell's `;` or `$` ran the candidate's commands in the builder (a red-team candidate's `-DX=1;id;...`). So no value
here holds a character the shell or ninja reads (`;`, `$`, quotes, backticks, `|`, `&`, `<`, `>`, spaces,
newlines). torch shell-quotes include paths (`extra_include_paths`) but does not escape them for ninja, where a
newline starts a line of the ninja file: they are held to plain paths.
"""

from __future__ import annotations

import re

# A path in a flag (`-I`, `-L`, `-l`) or in extra_include_paths: characters no shell or ninja file reads specially.
_PATH = r"[A-Za-z0-9_./+-]+"
# g++ (and nvcc's host compiler), one option each.
_HOST = re.compile(
    r"-O[0-3sgz]?|-Ofast|-g[0-3]?|-w|-pedantic|-pthread|-shared|-fPIC|-DNDEBUG"
    r"|-[DU][A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.,+:/-]*)?"
    r"|-std=[a-z0-9+]+"
    r"|-f(?!plugin)[a-z][a-z0-9-]*(=[A-Za-z0-9_.,+-]+)?"
    r"|-m[a-z][a-z0-9-]*(=[A-Za-z0-9_.,+-]+)?"
    r"|-W(?![lap],)[a-z][a-z0-9-]*(=[a-z0-9-]+)?"
    rf"|-[lLI]{_PATH}"
)
# The linker behind `-Wl,`: options that name no program or plugin, and plain values (a library path).
_LINKER = re.compile(r"-rpath|--(no-)?as-needed|-O[0-2]|--gc-sections|-Bsymbolic|-z|--export-dynamic|[A-Za-z0-9_./=+]+")
# nvcc, one option each (with its value after `=` where it takes one).
_NVCC = re.compile(
    r"-{1,2}use_fast_math|-lineinfo|-G|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda"
    r"|-{1,2}(rdc|relocatable-device-code|ftz|prec-div|prec-sqrt|fmad)=(true|false)"
    r"|(-arch|--gpu-architecture|-code|--gpu-code)=[a-z0-9_,]+"
    r"|(-gencode|--generate-code)=arch=[a-z0-9_]+,code=[a-z0-9_\[\],]+"
    r"|-{1,2}maxrregcount=[0-9]+|--default-stream=(legacy|null|per-thread)|--resource-usage|-{1,2}split-compile=[0-9]+"
)
# Tools nvcc hands options on to, and what each may be given.
_HANDED_ON = {"-Xcompiler": "host", "--compiler-options": "host", "-Xptxas": "ptxas", "--ptxas-options": "ptxas",
              "-Xcudafe": "cudafe"}  # fmt: skip
_PTXAS = re.compile(r"-v|--verbose|-O[0-3]|--allow-expensive-optimizations(=(true|false))?|--warn-on-spills")
_CUDAFE = re.compile(r"--diag[_-]suppress=[A-Za-z0-9_,]+")


class BuildFlagError(ValueError):
    """A flag the builder does not pass; the message names it."""


def check(name: str, flags: list[str]) -> None:
    """Refuse (BuildFlagError) any flag of the build argument `name` (extra_cflags, extra_cuda_cflags,
    extra_ldflags) outside the allow-list. An empty string is passed over, as torch's build does."""
    if not isinstance(flags, list) or not all(isinstance(flag, str) for flag in flags):
        raise BuildFlagError(f"{name}: flags must be strings")
    tokens = iter(flags)
    for flag in tokens:
        if not flag:
            continue
        if name == "extra_cuda_cflags" and flag in _HANDED_ON:
            _check_handed_on(_HANDED_ON[flag], next(tokens, ""), flag)
        elif name == "extra_cuda_cflags" and flag.split("=", 1)[0] in _HANDED_ON and "=" in flag:
            tool, values = flag.split("=", 1)
            _check_handed_on(_HANDED_ON[tool], values, tool)
        elif name == "extra_cuda_cflags" and (_NVCC.fullmatch(flag) or _HOST.fullmatch(flag)):
            continue
        elif name != "extra_cuda_cflags" and flag.startswith("-Wl,"):
            _check_values(_LINKER, flag.removeprefix("-Wl,"), flag)
        elif name != "extra_cuda_cflags" and _HOST.fullmatch(flag):
            continue
        else:
            raise BuildFlagError(f"{name}: the flag {flag!r} is not one the builder passes (see docs/evaluator.md)")


def check_include_paths(paths: list[str]) -> None:
    """Refuse (BuildFlagError) an include directory that a shell or ninja would read as more than a path."""
    if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
        raise BuildFlagError("extra_include_paths: paths must be strings")
    for path in paths:
        if not re.fullmatch(_PATH, path):
            raise BuildFlagError(
                f"extra_include_paths: {path!r} is not a path the builder passes (see docs/evaluator.md)"
            )


def _check_handed_on(tool: str, values: str, flag: str) -> None:
    pattern = {"host": _HOST, "ptxas": _PTXAS, "cudafe": _CUDAFE}[tool]
    _check_values(pattern, values, f"{flag} {values}")


def _check_values(pattern: re.Pattern[str], values: str, shown: str) -> None:
    for value in values.split(","):
        if not pattern.fullmatch(value):
            raise BuildFlagError(f"the flag {shown!r} is not one the builder passes (see docs/evaluator.md)")
