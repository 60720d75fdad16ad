"""Cache of compiled extensions, keyed by a hash of source, flags, torch version and device arch.

Worker side: `install()` wraps `torch.utils.cpp_extension.load_inline` and `load` before candidate code is
imported. A hit loads the cached library directly; a miss builds into the worker's private directory (at most
`build_workers` builds at once, via flock on lock files) and reports the build. Service side: `publish()` copies
a reported build into the cache atomically, so a candidate can never write into the cache itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import inspect
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from services.evaluator import cuda_headers, pch
from services.evaluator.sandbox import read_regular_file

# Arguments that only say where or how loudly to build; they do not change the binary.
NON_KEY_ARGS = frozenset({"name", "build_directory", "verbose", "keep_intermediates"})
PUBLISHED_SUFFIXES = (".so", ".cpp", ".cu", ".h", ".cuh")
MAX_ARTIFACT_BYTES = 512 << 20
MAX_GPUS = 16


def build_flags(device: str) -> dict[str, list[str]]:
    """Compiler flags the evaluator adds to every build on `device`; the candidate's own flags follow them."""
    flags: dict[str, list[str]] = {"extra_cflags": ["-O3"], "extra_ldflags": []}
    if device == "cuda":
        flags["extra_cuda_cflags"] = ["-O3"]
    return flags


def device_arch(device: str) -> str:
    """What a binary is built for: machine, Python ABI, torch build and, on CUDA, the GPU's compute capability."""
    import torch

    parts = [platform.machine(), f"py{sys.version_info[0]}{sys.version_info[1]}", torch.__version__]
    if device == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        parts += [f"cuda{torch.version.cuda}", f"sm{major}{minor}"]
    return "-".join(parts)


def cache_key(arguments: dict[str, Any], device: str) -> str:
    payload = {name: value for name, value in arguments.items() if name not in NON_KEY_ARGS}
    text = json.dumps({"args": payload, "arch": device_arch(device)}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _merge_flags(arguments: dict[str, Any], device: str) -> None:
    for name, ours in build_flags(device).items():
        theirs = arguments.get(name) or []
        arguments[name] = [*ours, *([theirs] if isinstance(theirs, str) else theirs)]


@contextlib.contextmanager
def build_slot(lock_dir: Path) -> Iterator[None]:
    """Hold one of the lock files in `lock_dir` (read-only is enough for flock) for the duration of a build."""
    locks = sorted(lock_dir.glob("build-*.lock"))
    while True:
        for path in locks:
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                os.close(fd)
            return
        time.sleep(0.2)


def _load_library(path: Path, name: str, is_python_module: bool) -> Any:
    if not is_python_module:
        import torch

        torch.ops.load_library(str(path))
        return str(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy_lists(arguments: dict[str, Any]) -> dict[str, Any]:
    return {name: list(value) if isinstance(value, list) else value for name, value in arguments.items()}


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CachingLoader:
    """Replacement for `load_inline`/`load` that consults the cache first."""

    def __init__(self, cache_dir: Path, build_root: Path, device: str, emit: Callable[..., None]) -> None:
        self.cache_dir, self.build_root, self.device, self.emit = cache_dir, build_root, device, emit
        self.hits = 0
        self.builds = 0

    def wrap(self, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def cached(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            if kind == "load":
                sources = arguments["sources"]
                sources = [sources] if isinstance(sources, str) else list(sources)
                arguments["source_contents"] = [Path(src).read_text(errors="replace") for src in sources]
            _merge_flags(arguments, self.device)
            key = cache_key({**arguments, "kind": kind}, self.device)
            if self.device == "cuda":
                # The PCH changes build speed, not the binary, so it stays out of the key.
                header = pch.find_pch(self.cache_dir, arguments.get("extra_cflags") or [])
                arguments["extra_cflags"] = [*(arguments.get("extra_cflags") or []), *pch.pch_cflags(header)]
            name = f"ext_{key[:24]}"
            cached_so = self.cache_dir / key / f"{name}.so"
            if cached_so.is_file():
                self.hits += 1
                self.emit("cache_hit", key=key)
                return _load_library(cached_so, name, arguments.get("is_python_module", True))
            build_dir = self.build_root / key
            build_dir.mkdir(parents=True, exist_ok=True)
            arguments.pop("source_contents", None)
            arguments.update(name=name, build_directory=str(build_dir))
            with build_slot(self.cache_dir / "locks"):
                result, light = self._build(original, arguments, kind, build_dir)
            self.builds += 1
            files = {
                p.name: _file_digest(p) for p in build_dir.iterdir() if p.is_file() and p.suffix in PUBLISHED_SUFFIXES
            }
            self.emit("built", key=key, files=files, light_headers=light)
            return result

        return cached

    def _build(
        self, original: Callable[..., Any], arguments: dict[str, Any], kind: str, build_dir: Path
    ) -> tuple[Any, bool]:
        """Build with the lighter CUDA include first where it applies (cuda_headers.py); True if that was used."""
        light = (
            cuda_headers.lighten(arguments.get("cuda_sources"))
            if kind == "load_inline" and self.device == "cuda"
            else None
        )
        if light is None:
            return original(**arguments), False
        try:
            # load_inline appends its bindings to the cpp_sources list it is given: each attempt gets its own lists.
            return original(**_copy_lists({**arguments, "cuda_sources": light})), True
        except RuntimeError as error:
            if not cuda_headers.may_need_full_header(str(error)):
                raise
        shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True)
        # torch renames a second build of one name with other sources to name_v1; the cache looks for the name.
        import torch.utils.cpp_extension as cpp_extension

        entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
        if isinstance(entries, dict):
            entries.pop(arguments["name"], None)
        return original(**_copy_lists(arguments)), False


def install(cache_dir: Path, build_root: Path, device: str, emit: Callable[..., None]) -> CachingLoader:
    """Route `torch.utils.cpp_extension.load_inline` and `load` through the cache (worker side)."""
    import torch.utils.cpp_extension as cpp_extension

    loader = CachingLoader(cache_dir, build_root, device, emit)
    cpp_extension.load_inline = loader.wrap(cpp_extension.load_inline, "load_inline")
    cpp_extension.load = loader.wrap(cpp_extension.load, "load")
    return loader


def prepare(cache_dir: Path, build_workers: int) -> None:
    """Create the cache and its build-slot lock files; readable, not writable, by sandbox uids."""
    (cache_dir / "locks").mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir, 0o755)
    os.chmod(cache_dir / "locks", 0o755)
    for stale in (cache_dir / "locks").glob("build-*.lock"):
        stale.unlink()
    for slot in range(build_workers):
        (cache_dir / "locks" / f"build-{slot}.lock").touch(mode=0o644)
    # One lock per GPU: a worker holds it while its models run, so timings never share a GPU (backends/cuda.py).
    for gpu in range(MAX_GPUS):
        (cache_dir / "locks" / f"gpu-{gpu}.lock").touch(mode=0o644)


def publish(cache_dir: Path, build_root: Path, key: str, files: dict[str, str]) -> bool:
    """Copy a worker's finished build into the cache if every file still has the digest the build reported."""
    name = f"ext_{key[:24]}.so"
    if len(key) != 64 or not all(c in "0123456789abcdef" for c in key) or name not in files:
        return False
    target = cache_dir / key
    if target.exists():
        return True
    # Workers are dead by now, so the tree cannot change under us; refuse a build dir that leads elsewhere.
    if (build_root / key).resolve() != build_root.resolve() / key:
        return False
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_dir))
    try:
        for filename, digest in files.items():
            if "/" in filename or filename.startswith(".") or not filename.endswith(PUBLISHED_SUFFIXES):
                return False
            data = read_regular_file(build_root / key / filename, MAX_ARTIFACT_BYTES)
            if hashlib.sha256(data).hexdigest() != digest:
                return False
            (staging / filename).write_bytes(data)
            os.chmod(staging / filename, 0o644)
        os.chmod(staging, 0o755)
        os.rename(staging, target)
        return True
    except OSError:
        return target.exists()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
