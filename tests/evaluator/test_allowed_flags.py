"""The builder's flag allow-list: the flags kernels are written with pass, and every road to running a program or
loading code in the builder is refused."""

from __future__ import annotations

import pytest

from services.evaluator.allowed_flags import BuildFlagError, check

ALLOWED = [
    ("extra_cuda_cflags", ["-O3", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr", "-std=c++17", ""]),
    ("extra_cuda_cflags", ["-arch=sm_90", "-gencode=arch=compute_90,code=sm_90", "-maxrregcount=64", "-DNDEBUG"]),
    ("extra_cuda_cflags", ["-Xptxas", "-v", "-Xcompiler", "-fopenmp,-O3", "-Xcompiler=-march=native"]),
    ("extra_cuda_cflags", ["-U__CUDA_NO_HALF_OPERATORS__", "-Xcudafe", "--diag_suppress=177"]),
    ("extra_cflags", ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-std=c++17", "-I/usr/include"]),
    ("extra_ldflags", ["-lcublas", "-Wl,-rpath,/usr/lib", "-L/usr/local/cuda/lib64", "-fopenmp"]),
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
]


@pytest.mark.parametrize(("name", "flags"), ALLOWED)
def test_the_flags_kernels_use_pass(name: str, flags: list[str]) -> None:
    check(name, flags)


@pytest.mark.parametrize(("name", "flags"), REFUSED)
def test_flags_that_run_or_load_code_are_refused(name: str, flags: list[str]) -> None:
    with pytest.raises(BuildFlagError, match="flag"):
        check(name, flags)
