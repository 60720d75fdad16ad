"""Faster `load_inline` builds: the device's own arch and a g++ precompiled header of `torch/extension.h`.

`load_inline` writes `main.cpp` starting with `#include <torch/extension.h>`, which g++ spends most of its time
parsing. We compile that header once per (compiler, torch, flag set) into a `.gch` under the cache directory and
put `-include <cache>/pch/<key>/torch_extension_pch.h` in front of the candidate's own `extra_cflags`; the
candidate's `#include` then hits the include guards. g++ silently ignores a PCH whose flags do not match
(`-Winvalid-pch` makes it say so), so a stale or foreign PCH costs speed, never correctness.

torch's own `use_pch=True` writes its `.gch` into the torch installation and deletes it on every build without
the option, which breaks with several workers sharing one read-only installation; this module keeps its own.
nvcc has no precompiled headers: the `.cu` side gains only from building a single arch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.evaluator.sandbox import tool_env

log = logging.getLogger(__name__)

PCH_HEADER_NAME = "torch_extension_pch.h"
PCH_HEADER_TEXT = "#pragma once\n#include <torch/extension.h>\n"
# The split build's host code (split_build.py) includes only torch/types.h, and its binding only torch's pybind11
# casters and error translation (torch/csrc/Exceptions.h, which includes torch/csrc/utils/pybind.h): a PCH of each
# lives beside the other. Loading a PCH of hundreds of MiB takes seconds: the binding's is under a third of the size
# of extension.h's, and a binding compiled against it takes 3.0 s instead of 7.2 s (BENCHMARKS.md).
TYPES_HEADER = "torch/types.h"
BINDING_HEADER = "torch/csrc/Exceptions.h"
HEADER_NAMES = {
    "torch/extension.h": PCH_HEADER_NAME,
    TYPES_HEADER: "torch_types_pch.h",
    BINDING_HEADER: "torch_binding_pch.h",
}
PCH_BUILD_TIMEOUT_S = 300


def device_arch(device_index: int = 0) -> str:
    """`TORCH_CUDA_ARCH_LIST` value for one device, read from the device itself (e.g. "9.0")."""
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return f"{major}.{minor}"


def _ninja_cflags(extra_cflags: Sequence[str], with_cuda: bool) -> list[str] | None:
    """The exact host `cflags` torch would write to build.ninja, read back from a throw-away ninja file."""
    from torch.utils import cpp_extension

    writer = getattr(cpp_extension, "_write_ninja_file_to_build_library", None)
    if writer is None:
        return None
    args = {
        "path": None,
        "name": "pch_probe",
        "sources": ["main.cpp"],
        "extra_cflags": list(extra_cflags),
        "extra_cuda_cflags": [],
        "extra_sycl_cflags": [],
        "extra_ldflags": [],
        "extra_include_paths": [],
        "with_cuda": with_cuda,
        "with_sycl": False,
        "is_standalone": False,
    }
    accepted = inspect.signature(writer).parameters
    with tempfile.TemporaryDirectory() as tmp:
        ninja_file = os.path.join(tmp, "build.ninja")
        args["path"] = ninja_file
        args["sources"] = [os.path.join(tmp, "main.cpp")]
        try:
            writer(**{k: v for k, v in args.items() if k in accepted})
        except Exception:  # private torch API: any change in it only disables the PCH
            log.warning("cannot read torch's build flags; building without a precompiled header", exc_info=True)
            return None
        text = Path(ninja_file).read_text()
    for line in text.splitlines():
        if line.startswith("cflags = "):
            return [f for f in shlex.split(line[len("cflags = ") :]) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return None


def _compiler() -> str:
    from torch.utils.cpp_extension import get_cxx_compiler

    return get_cxx_compiler()


def _compiler_identity(compiler: str) -> str:
    # Run by the service itself when it plans a split build: the compiler gets no secret of its environment.
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False, env=tool_env())
    return out.stdout.splitlines()[0] if out.stdout else compiler


def pch_key(cflags: Sequence[str], compiler: str, header: str = "torch/extension.h") -> str:
    import torch

    blob = "\0".join([_compiler_identity(compiler), shutil.which(compiler) or compiler, torch.__version__, *cflags])
    if header != "torch/extension.h":
        blob += f"\0{header}"
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _unique(flags: Sequence[str]) -> list[str]:
    """Flags with exact repeats dropped (`-O3 -O3` is `-O3`), so merged flag lists share one PCH."""
    return list(dict.fromkeys(flags))


def _locate(
    cache_dir: str | Path, extra_cflags: Sequence[str], with_cuda: bool, header: str = "torch/extension.h"
) -> tuple[Path, list[str]] | None:
    compiler = _compiler()
    if "clang" in _compiler_identity(compiler).lower():
        return None
    cflags = _ninja_cflags(_unique(extra_cflags), with_cuda)
    if cflags is None:
        return None
    return Path(cache_dir) / "pch" / pch_key(cflags, compiler, header), cflags


def find_pch(
    cache_dir: str | Path, extra_cflags: Sequence[str] = (), with_cuda: bool = True, header: str = "torch/extension.h"
) -> Path | None:
    """The prebuilt header for these flags, or None; never builds (workers may not write the cache)."""
    try:
        located = _locate(cache_dir, extra_cflags, with_cuda, header)
    except Exception:  # a missing compiler or torch API change costs the PCH, never the build
        log.warning("no precompiled header lookup", exc_info=True)
        return None
    name = HEADER_NAMES[header]
    if located is None or not (located[0] / (name + ".gch")).is_file():
        return None
    return located[0] / name


def ensure_pch(
    cache_dir: str | Path, extra_cflags: Sequence[str] = (), with_cuda: bool = True, header: str = "torch/extension.h"
) -> Path | None:
    """Path of the header to `-include` for these flags, building its `.gch` once; None when unsupported.

    Trusted (service-side) code only. Concurrent builders serialise on a lock file; the finished directory is
    published by an atomic rename.
    """
    located = _locate(cache_dir, extra_cflags, with_cuda, header)
    if located is None:
        return None
    final, cflags = located
    root = final.parent
    compiler = _compiler()
    name = HEADER_NAMES[header]
    path = final / name
    if (final / (name + ".gch")).is_file():
        return path
    with _locked(root / (final.name + ".lock")):
        if (final / (name + ".gch")).is_file():
            return path
        staging = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=root))
        try:
            (staging / name).write_text(f"#pragma once\n#include <{header}>\n")
            cmd = [
                compiler,
                *cflags,
                "-x",
                "c++-header",
                str(staging / name),
                "-o",
                str(staging / (name + ".gch")),
            ]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=PCH_BUILD_TIMEOUT_S, check=False)
            if run.returncode != 0:
                log.warning("precompiled header build failed (%s): %s", run.returncode, run.stderr[-2000:])
                return None
            (staging / "command.txt").write_text(shlex.join(cmd) + "\n")
            os.chmod(staging, 0o755)
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def pch_cflags(header: Path | None) -> list[str]:
    """Flags that make g++ use the PCH; `-Winvalid-pch` reports (in the build log) a PCH it had to skip."""
    return ["-Winvalid-pch", "-include", str(header)] if header is not None else []


def main() -> None:
    """`python -m services.evaluator.pch CACHE_DIR [FLAGS...]`: build the PCH ahead of the first candidate.

    The evaluator service runs this at start-up on CUDA machines for its default flags; with split builds on
    (EVALUATOR_SPLIT_BUILD) it also builds the headers of their host code and binding.
    """
    import sys

    import torch

    logging.basicConfig(level=logging.INFO)
    with_cuda = torch.cuda.is_available()
    from services.evaluator import split_build

    headers = ["torch/extension.h"]
    if with_cuda and split_build.enabled():  # the split build's host code and binding
        headers += [TYPES_HEADER, BINDING_HEADER]
    # One compiler each, at once: the service's first split build waits for the slowest, not for the sum.
    with ThreadPoolExecutor(len(headers)) as pool:
        built = pool.map(
            lambda header: ensure_pch(sys.argv[1], sys.argv[2:], with_cuda=with_cuda, header=header), headers
        )
        for path in built:
            log.info("precompiled header: %s", path)


if __name__ == "__main__":
    main()
