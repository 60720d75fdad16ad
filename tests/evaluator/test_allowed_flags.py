"""The builder's flag allow-list: the flags kernels are written with pass, and every road to running a program or
loading code in the builder is refused."""

from __future__ import annotations

from typing import Any

import pytest

from services.evaluator.allowed_flags import BuildFlagError, check, check_include_paths

ALLOWED = [
    ("extra_cuda_cflags", ["-O3", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr", "-std=c++17", ""]),
    ("extra_cuda_cflags", ["-arch=sm_90", "-gencode=arch=compute_90,code=sm_90", "-maxrregcount=64", "-DNDEBUG"]),
    ("extra_cuda_cflags", ["-Xptxas", "-v", "-Xcompiler", "-fopenmp,-O3", "-Xcompiler=-march=native"]),
    ("extra_cuda_cflags", ["-U__CUDA_NO_HALF_OPERATORS__", "-Xcudafe", "--diag_suppress=177"]),
    ("extra_cflags", ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-std=c++17", "-I/usr/include"]),
    ("extra_ldflags", ["-lcublas", "-Wl,-rpath,/usr/lib", "-L/usr/local/cuda/lib64", "-fopenmp"]),
    ("extra_cflags", ["-DBLOCK_SIZE=256", "-DSCALE=0.5f", "-DUSE_FAST", "-DPATH=a/b:c-d,e+f"]),
]

REFUSED = [
    ("extra_ldflags", ["-wrapper", "/usr/bin/env"]),
    ("extra_cflags", ["-fplugin=./x.so"]),
    ("extra_cflags", ["-specs=./x.specs"]),
    ("extra_cflags", ["-B./bin"]),
    ("extra_cflags", ["@args.txt"]),
    ("extra_ldflags", ["-Wl,-plugin,./x.so"]),
    ("extra_ldflags", ["-T", "script.ld"]),
    ("extra_cuda_cflags", ["-ccbin", "./gcc"]),
    ("extra_cuda_cflags", ["--compiler-bindir=./bin"]),
    ("extra_cuda_cflags", ["--run"]),
    ("extra_cuda_cflags", ["-Xcompiler", "-wrapper,/usr/bin/env"]),
    ("extra_cuda_cflags", ["-Xlinker", "-plugin"]),
    ("extra_cuda_cflags", ["-optf", "args.txt"]),
    ("extra_cflags", [3]),
    # torch writes flags into build.ninja unquoted and ninja runs them through /bin/sh: a red-team candidate's
    # `-DX=1;id;...` ran its commands in the builder.
    ("extra_cflags", ["-DX=1;id;false;"]),
    ("extra_cflags", ["-DX=$$(id)"]),
    ("extra_cflags", ["-DX=`id`"]),
    ("extra_cflags", ["-DX=a|id"]),
    ("extra_cflags", ["-DX=a>out"]),
    ("extra_cuda_cflags", ["-Xcompiler", "-DX=1;id"]),
    ("extra_cuda_cflags", ["-DX=1&&id"]),
]


@pytest.mark.parametrize(("name", "flags"), ALLOWED)
def test_the_flags_kernels_use_pass(name: str, flags: list[str]) -> None:
    check(name, flags)


@pytest.mark.parametrize(("name", "flags"), REFUSED)
def test_flags_that_run_or_load_code_are_refused(name: str, flags: list[str]) -> None:
    with pytest.raises(BuildFlagError, match="flag"):
        check(name, flags)


def test_include_paths_are_plain_paths() -> None:
    """torch writes extra_include_paths into build.ninja shell-quoted but not escaped for ninja: a newline there
    starts a line of the ninja file (a rule of the candidate's), a `$` is ninja's."""
    check_include_paths(["/usr/local/cuda/include", "third_party/cutlass-3.5/include", "."])
    refused: list[Any] = ["x\nrule run\n  command = id", "x';id;'", "$(id)", "a b", 3]
    for path in refused:
        with pytest.raises(BuildFlagError):
            check_include_paths([path])


def test_load_source_names_are_plain_names() -> None:
    """load()'s file names reach build.ninja: a name ending in a newline passed a `$`-anchored pattern and broke
    the line it stood on (a red-team candidate)."""
    from services.evaluator.build_cache import BuildRequestError, parse_request

    def request(name: str) -> dict[str, Any]:
        return {"kind": "load", "arguments": {"name": "ext", "source_files": {name: "int f() { return 1; }"}}}

    kind, _ = parse_request(request("scaled.cpp"), "cpu")
    assert kind == "load"
    for name in ["scaled.cpp\n", "../scaled.cpp", "a b.cpp", "$x.cpp"]:
        with pytest.raises(BuildRequestError, match="plain names"):
            parse_request(request(name), "cpu")
