"""Extension builds by a trusted builder, and the cache of what it built.

A candidate's `torch.utils.cpp_extension.load_inline`/`load` never compiles in the candidate's process. The
call is sent to the service as a `build_request` (its arguments as data); the service computes the cache key
itself from those arguments, the evaluator's flags and the target, and on a miss runs a `build` worker (a
process of its own, under another sandbox uid, that imports nothing of the candidate), reads what it produced
and publishes it into the cache atomically. The candidate's process then loads the published library,
read-only. What a candidate's process says about keys, digests or files counts for nothing.

Worker side: `install()` (the candidate's stand-in for load_inline/load) and `build()` (the builder).
Service side: `parse_request()`, `cache_key()`, `cached_library()`, `publish()`, `recorded_build_path()`.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from services.evaluator import allowed_flags, cuda_headers, pch, split_build
from services.evaluator.sandbox import tool_env

log = logging.getLogger(__name__)

# Arguments that only say where or how loudly to build; they do not change the binary.
NON_KEY_ARGS = frozenset({"name", "build_directory", "verbose", "keep_intermediates"})
PUBLISHED_SUFFIXES = (".so", ".cpp", ".cu", ".h", ".cuh")
# A built library is a few MiB (one arch, no debug info); a cap far above that still bounds what one evaluation can
# leave in the shared cache (MAX_BUILDS of them, kept across restarts) and what the service reads into memory.
MAX_ARTIFACT_BYTES = 64 << 20
# Errors reading a builder's output that only the candidate's files cause (a symlink, a missing or foreign file).
CANDIDATE_FILE_ERRORS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EACCES, errno.EPERM})
# Most extension builds one evaluation may ask for, and the size of one request's arguments.
MAX_BUILDS = 8
MAX_REQUEST_BYTES = 2 << 20
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # fullmatch: `$` would let a final newline through
# The argument the service adds to a CUDA load_inline request it wants split-built (split_build.py): the key of
# the binding object the builder will compile, which the service alone may publish into the binding cache.
SPLIT_ARGUMENT = "split_build"
_expected_bindings: dict[str, str] = {}
# The sha256 of each library this service published, by key (cached_library's `verify`).
_published: dict[str, str] = {}
# How a library was built: `split` (split_build.py), `whole` (load_inline's own build), or `fallback` (a split was
# asked for and the whole build decided). The service writes it beside each library it publishes.
BUILD_RECORD = "build.json"
# Parts of a build the builder times (BuiltExtension.parts_s), reported as `build_<part>` phases.
BUILD_PARTS = frozenset(
    {"whole", "split_plan", "split_device", "split_host", "split_stub", "split_binding", "split_link",
     "split_discarded"}
)  # fmt: skip


class BuildRequestError(ValueError):
    """A build request the service refuses; the candidate's import fails with this message."""


class BuildFailedError(BuildRequestError):
    """A build that ran and left no library to load; `build_path` says which path decided it."""

    def __init__(self, message: str, build_path: str) -> None:
        super().__init__(message)
        self.build_path = build_path


@dataclass
class BuiltExtension:
    """What the builder made of one request: the files to publish, whether the light CUDA header was used, the
    build path, and the seconds of each part it timed (split parts by ninja's log, `split_discarded` for a split
    thrown away, `whole` for load_inline's build)."""

    files: list[str]
    light_headers: bool
    build_path: str
    parts_s: dict[str, float]


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


@functools.cache
def service_arch(device: str) -> str:
    """`device_arch` for the service: asked of a throwaway process on CUDA, so the service never opens a context."""
    if device != "cuda":
        return device_arch(device)
    code = "from services.evaluator.build_cache import device_arch; print(device_arch('cuda'))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, cwd=_REPO_ROOT,
        env=tool_env(),
    )  # fmt: skip
    return done.stdout.strip()


_REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_key(kind: str, arguments: dict[str, Any], arch: str) -> str:
    payload = {name: value for name, value in arguments.items() if name not in NON_KEY_ARGS}
    text = json.dumps({"kind": kind, "args": payload, "arch": arch}, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()
    if isinstance(arguments.get(SPLIT_ARGUMENT), str):
        _expected_bindings[key] = arguments[SPLIT_ARGUMENT]
    return key


def library_name(key: str) -> str:
    return f"ext_{key[:24]}"


def cached_library(cache_dir: Path, key: str, verify: bool = False) -> Path | None:
    """The library published under `key`, if any; with `verify` (process isolation, where a job runs under the
    service's uid and can rewrite the cache) only one this service published and whose bytes are still those."""
    path = cache_dir / key / f"{library_name(key)}.so"
    if not path.is_file() or (verify and _published.get(key) != _file_digest(path)):
        return None
    return path


def _file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _merge_flags(arguments: dict[str, Any], device: str) -> None:
    for name, ours in build_flags(device).items():
        theirs = arguments.get(name) or []
        arguments[name] = [*ours, *([theirs] if isinstance(theirs, str) else theirs)]


def _is_data(value: Any) -> bool:
    """Strings, booleans, None, and lists or string-keyed dicts of those: all a build argument may be."""
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, list):
        return all(_is_data(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_data(v) for k, v in value.items())
    return False


def parse_request(event: dict[str, Any], device: str, allow_split: bool = True) -> tuple[str, dict[str, Any]]:
    """The (kind, arguments) of a candidate's build request, checked as data and with our flags merged in. With
    split builds enabled and `allow_split`, a CUDA `load_inline` the splitter understands asks for a split build
    (SPLIT_ARGUMENT), which also gives it a cache key of its own: a whole build is never served a split library."""
    import torch.utils.cpp_extension as cpp_extension

    kind, arguments = event.get("kind"), event.get("arguments")
    if kind not in ("load_inline", "load") or not isinstance(arguments, dict):
        raise BuildRequestError("malformed build request")
    if len(json.dumps(arguments)) > MAX_REQUEST_BYTES:
        raise BuildRequestError(f"build arguments larger than {MAX_REQUEST_BYTES} bytes")
    known = set(inspect.signature(getattr(cpp_extension, kind)).parameters)
    unknown = set(arguments) - known - {"source_files"}
    if unknown or not _is_data(arguments):
        raise BuildRequestError(f"unsupported build arguments: {sorted(unknown) or 'non-data values'}")
    if kind == "load":
        files = arguments.get("source_files")
        if not isinstance(files, dict) or not files or not all(_SOURCE_NAME.fullmatch(name) for name in files):
            raise BuildRequestError("load() needs source files with plain names")
        arguments.pop("sources", None)
    arguments = {name: value for name, value in arguments.items() if name not in NON_KEY_ARGS}
    # SYCL builds use a compiler no evaluator has, with flags the allow-list does not know.
    if arguments.get("with_sycl") or arguments.get("extra_sycl_cflags") or arguments.get("sycl_sources"):
        raise BuildRequestError("SYCL builds are not supported")
    # torch writes its own precompiled header beside torch/extension.h, in the install every later build of every
    # job includes it from: a red-team build asked for one, and only the install's owner (not the builder) kept it
    # out. The evaluator precompiles torch's headers itself (pch.py).
    if arguments.get("use_pch"):
        raise BuildRequestError("use_pch is not supported: the evaluator precompiles torch's headers itself")
    try:
        for name in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
            flags = arguments.get(name) or []
            allowed_flags.check(name, [flags] if isinstance(flags, str) else flags)
        paths = arguments.get("extra_include_paths") or []
        allowed_flags.check_include_paths([paths] if isinstance(paths, str) else paths)
    except allowed_flags.BuildFlagError as error:
        raise BuildRequestError(str(error)) from error
    _merge_flags(arguments, device)
    if allow_split and kind == "load_inline" and device == "cuda" and split_build.enabled():
        binding = split_build.expected_binding(arguments, build_flags(device)["extra_cflags"])
        if binding is not None:
            arguments[SPLIT_ARGUMENT] = binding
    return kind, arguments


def publish(
    cache_dir: Path,
    builder_root: Path,
    builder_uid: int | None,
    key: str,
    files: list[str],
    build_path: str,
    verify: bool = False,
) -> Path:
    """Copy the builder's output (its process tree is dead) into the cache under `key`, atomically, with the record
    of its build path (BUILD_RECORD, written by the service: no builder file of that name is published). What is
    already there stays, unless `verify` (cached_library) finds it is not what this service published: then it is
    replaced."""
    name = f"{library_name(key)}.so"
    target = cache_dir / key
    if cached_library(cache_dir, key, verify) is not None:
        return target / name
    wanted = {f for f in files if isinstance(f, str) and _SOURCE_NAME.fullmatch(f) and f.endswith(PUBLISHED_SUFFIXES)}
    if name not in wanted:
        raise BuildRequestError("the build produced no library")
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_dir))
    stale = None
    try:
        for filename in sorted(wanted):
            data = _read_output(builder_root, filename, builder_uid)
            (staging / filename).write_bytes(data)
            os.chmod(staging / filename, 0o644)
        (staging / BUILD_RECORD).write_text(json.dumps({"build_path": build_path}))
        os.chmod(staging / BUILD_RECORD, 0o644)
        os.chmod(staging, 0o755)
        _publish_binding(cache_dir, builder_root, builder_uid, key, files)
        digest = _file_digest(staging / name)
        if target.exists():  # not this service's (cached_library above): set aside, then removed
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=cache_dir))
            os.rename(target, stale / key)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.exists():
                raise
        _published[key] = digest
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    return target / name


def recorded_build_path(cache_dir: Path, key: str, split_asked: bool) -> str:
    """The build path of the library published under `key`. A key asked for no split is a whole build whatever its
    record says; a split key's library without a readable record (published before records were kept) counts as
    split, so a verdict it could have caused is still checked with a whole build."""
    if not split_asked:
        return "whole"
    try:
        recorded = json.loads((cache_dir / key / BUILD_RECORD).read_text()).get("build_path")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return recorded if recorded in ("split", "fallback") else "split"


def reported_build_path(claimed: Any, split_asked: bool) -> str:
    """The builder's account of its path, within what the service asked for: no split asked, a whole build; a
    split asked, `fallback` only when the builder says the whole build decided, otherwise split."""
    if not split_asked:
        return "whole"
    return "fallback" if claimed == "fallback" else "split"


def reported_parts(reported: Any, builder_s: float) -> dict[str, float]:
    """The builder's seconds per part of its build: known part names only, each a finite number between 0 and
    the builder's time by the service's clock."""
    if not isinstance(reported, dict):
        return {}
    return {
        part: min(max(0.0, float(seconds)), builder_s)
        for part, seconds in reported.items()
        if part in BUILD_PARTS and isinstance(seconds, int | float) and math.isfinite(seconds)
    }


def _read_output(builder_root: Path, filename: str, builder_uid: int | None) -> bytes:
    """A file the builder left. What is wrong with it (past the size cap, a link where a file should be, a file it
    named and removed) is the candidate's doing: its build failed, not the evaluator. A full or failing disk of the
    service's stays the service's error."""
    from services.evaluator.safe_files import read_file_beneath

    try:
        return read_file_beneath(builder_root, f"home/build/{filename}", MAX_ARTIFACT_BYTES, builder_uid)
    except (ValueError, OSError) as error:
        if isinstance(error, OSError) and error.errno not in CANDIDATE_FILE_ERRORS:
            raise
        raise BuildRequestError(f"the build's output was refused: {error}") from error


def _publish_binding(cache_dir: Path, builder_root: Path, builder_uid: int | None, key: str, files: list[str]) -> None:
    """Store the binding object of a split build, under the key the service computed from the request itself."""
    from services.evaluator.safe_files import read_file_beneath

    expected = _expected_bindings.pop(key, None)
    filename = f"split_binding_{expected}.o"
    if expected is None or filename not in files or split_build.cached_binding(cache_dir, expected) is not None:
        return
    try:
        data = read_file_beneath(builder_root, f"home/build/{filename}", MAX_ARTIFACT_BYTES, builder_uid)
        split_build.store_binding(cache_dir, expected, data)
    except (OSError, ValueError):  # a binding not kept costs the next build time, never this one's verdict
        log.warning("split binding %s not stored", expected, exc_info=True)


def prepare(cache_dir: Path) -> None:
    """Create the cache: readable, never writable, by sandbox uids."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir, 0o755)
    for stale in cache_dir.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)


# Worker side ---------------------------------------------------------------------------------------------------


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


class BuildClient:
    """The candidate's `load_inline`/`load`: ask the service to build, then load what it published."""

    def __init__(self, emit: Callable[..., None], control: IO[str]) -> None:
        self.emit, self.control = emit, control
        # Once timing commands flow on the control channel, no build can be asked for.
        self.closed = False
        self.loaded: dict[str, Any] = {}

    def wrap(self, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def build_by_service(*args: Any, **kwargs: Any) -> Any:
            arguments = dict(signature.bind(*args, **kwargs).arguments)
            if kind == "load":
                sources = arguments["sources"]
                sources = [sources] if isinstance(sources, str) else list(sources)
                arguments["source_files"] = {Path(s).name: Path(s).read_text(errors="replace") for s in sources}
            # A call repeated in every forward (as torch's own load_inline allows) gets the library it already has.
            memo = json.dumps({"kind": kind, "arguments": arguments}, sort_keys=True, default=repr)
            if memo in self.loaded:
                return self.loaded[memo]
            if self.closed:
                raise RuntimeError(
                    "extensions can be built only while ModelNew is imported and its correctness outputs are written"
                )
            self.emit("build_request", kind=kind, arguments=arguments)
            line = self.control.readline()
            reply = json.loads(line) if line.strip() else {"error": "the service closed the build channel"}
            if reply.get("error"):
                raise RuntimeError(f"Error building extension: {reply['error']}")
            library = _load_library(Path(reply["path"]), reply["name"], arguments.get("is_python_module", True))
            self.loaded[memo] = library
            return library

        return build_by_service


def install(device: str, emit: Callable[..., None], control: IO[str]) -> BuildClient:
    """Route `torch.utils.cpp_extension.load_inline` and `load` to the service's builder (candidate side)."""
    import torch.utils.cpp_extension as cpp_extension

    client = BuildClient(emit, control)
    cpp_extension.load_inline = client.wrap(cpp_extension.load_inline, "load_inline")
    cpp_extension.load = client.wrap(cpp_extension.load, "load")
    return client


def _copy_lists(arguments: dict[str, Any]) -> dict[str, Any]:
    return {name: list(value) if isinstance(value, list) else value for name, value in arguments.items()}


def build(job: dict[str, Any], build_dir: Path, device: str, cache_dir: Path) -> BuiltExtension:
    """Builder side: compile one request into `build_dir` without loading it."""
    import torch.utils.cpp_extension as cpp_extension

    kind, arguments = job["kind"], dict(job["arguments"])
    name = library_name(job["key"])
    split_binding = arguments.pop(SPLIT_ARGUMENT, None)
    parts: dict[str, float] = {}
    if split_binding is not None and kind == "load_inline" and device == "cuda":
        started = time.monotonic()
        split = _split(arguments, build_dir, name, cache_dir, device, str(split_binding))
        if split is not None:
            return split
        parts["split_discarded"] = time.monotonic() - started
    if kind == "load":
        source_dir = build_dir.parent / "sources"
        source_dir.mkdir(exist_ok=True)
        arguments["sources"] = []
        for filename, text in arguments.pop("source_files").items():
            (source_dir / filename).write_text(text)
            arguments["sources"].append(str(source_dir / filename))
    if device == "cuda":
        # The PCH changes build speed, not the binary, so it stays out of the key.
        header = pch.find_pch(cache_dir, arguments.get("extra_cflags") or [])
        arguments["extra_cflags"] = [*(arguments.get("extra_cflags") or []), *pch.pch_cflags(header)]
    arguments.update(name=name, build_directory=str(build_dir))
    original = cpp_extension.load_inline if kind == "load_inline" else cpp_extension.load
    # Never load what was built: a library's static initialisers are candidate code.
    importer = cpp_extension._import_module_from_library
    cpp_extension._import_module_from_library = lambda module_name, path, is_python_module: path
    started = time.monotonic()
    try:
        light = compile_extension(original, arguments, kind, device, build_dir)
    finally:
        cpp_extension._import_module_from_library = importer
    parts["whole"] = time.monotonic() - started
    files = [p.name for p in build_dir.iterdir() if p.is_file() and p.suffix in PUBLISHED_SUFFIXES]
    return BuiltExtension(files, light, "fallback" if split_binding is not None else "whole", parts)


def _split(
    arguments: dict[str, Any], build_dir: Path, name: str, cache_dir: Path, device: str, expected: str
) -> BuiltExtension | None:
    """A split build (split_build.py), or None after any failure: the whole build then decides the verdict."""
    try:
        split = split_build.build(
            _copy_lists(arguments), build_dir, name, cache_dir, build_flags(device)["extra_cflags"]
        )
    except Exception as error:  # a split that fails in any way only costs time
        log.info("split build of %s failed; building whole: %s", name, str(error)[-2000:])
        shutil.rmtree(build_dir)
        build_dir.mkdir()
        return None
    published = [f for f in split.files if f.endswith(PUBLISHED_SUFFIXES)]
    if split.binding_key == expected and f"split_binding_{expected}.o" in split.files:
        published.append(f"split_binding_{expected}.o")
    return BuiltExtension(published, True, "split", {f"split_{part}": s for part, s in split.parts_s.items()})


def compile_extension(
    original: Callable[..., Any], arguments: dict[str, Any], kind: str, device: str, build_dir: Path
) -> bool:
    """Build with the lighter CUDA include first where it applies (cuda_headers.py); True if that was used."""
    light = cuda_headers.lighten(arguments.get("cuda_sources")) if kind == "load_inline" and device == "cuda" else None
    if light is None:
        original(**_copy_lists(arguments))
        return False
    try:
        # load_inline appends its bindings to the cpp_sources list it is given: each attempt gets its own lists.
        original(**_copy_lists({**arguments, "cuda_sources": light}))
        return True
    except RuntimeError as error:
        if not cuda_headers.may_need_full_header(str(error)):
            raise
    shutil.rmtree(build_dir)
    build_dir.mkdir()
    # torch renames a second build of one name with other sources to name_v1; the cache looks for the name.
    import torch.utils.cpp_extension as cpp_extension

    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if isinstance(entries, dict):
        entries.pop(arguments["name"], None)
    original(**_copy_lists(arguments))
    return False
