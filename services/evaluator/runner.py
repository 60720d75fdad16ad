"""The jobs a worker runs, one per process: the reference's data, a candidate, the reference timed, or a build.

Runs inside the sandboxed worker process only; see the threat model in docs/evaluator.md. The service is the
judge: it sends every command, measures how long each took from outside, and checks what comes back. Nothing
here decides a verdict.

Roles:
- `reference`: draw every trial's inputs with the reference's `get_inputs`, run `Model`, save inputs and outputs
  (on the `drawn` data path only the init inputs, and each trial's shapes and sign).
- `candidate`: import the candidate (its extension builds are requested from the service), write its outputs
  on the correctness inputs (on the `drawn` path: one trial per command, on inputs it draws from the trial's
  seed, each output saved for the timer's check), then serve timing commands (timed calls draw fresh inputs with
  the reference's `get_inputs`, from seeds the judge sends with each block).
- `timer`: the reference model, served with the same timing commands in a process of its own, so a candidate
  can never reach the model it is timed against; it also makes the judge's full checks of timed calls (`check`:
  the output a candidate saved for a call against the timer's own output of that call, on its device), and on the
  `drawn` path the correctness trials' (`trial` computes its output of a trial first).
- `build`: compile one extension the candidate asked for; nothing of the candidate is imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import io
import json
import os
import random
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import numpy
import torch
import torch.utils.cpp_extension  # noqa: F401 - imported before candidate code, so build_cache can wrap it

from services.evaluator import (
    build_cache,
    compare,
    device_handover,
    gpu_checks,
    held_memory,
    output_digest,
    pch,
    sandbox,
)
from services.evaluator.backends import KernelBackend, get_backend, triton_support
from services.evaluator.guards import Guard

# Bound before any candidate code runs: what outputs are written and inputs read with.
_save = torch.save
_load = torch.load
_as_subclass = torch.Tensor.as_subclass
_Tensor = torch.Tensor
# What switches torch's Python hooks off around the runner's own copies (_without_candidate_hooks): an immutable type
# (its __enter__ cannot be replaced) and functions, where the context-manager class of the dispatch keys is not.
_no_torch_function = torch._C.DisableTorchFunction
_key_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_exclude_key = torch._C._dispatch_tls_set_dispatch_key_excluded
_PYTHON_KEYS = (torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot)
# Copies that no kernel of the candidate's can stand in for (_copy_of): torch's copy and clone run whatever
# kernel is registered for them, and a candidate can register its own (torch.library, or C++). On a CPU a memmove; on
# a GPU the CUDA driver's copy, in the order of torch's current stream.
_memmove = ctypes.memmove
# The CPU layout copy (_dense_copy_of) gathers bytes with numpy, which no kernel of the candidate's reaches.
_as_strided_array = numpy.lib.stride_tricks.as_strided
_copy_array = numpy.copyto
_array_over = numpy.frombuffer
_uint8 = numpy.uint8
_current_stream = torch.cuda.current_stream


def _cuda_driver_copy() -> Any:
    """cuMemcpyDtoDAsync_v2 of the CUDA driver, bound here, before any candidate code runs; None without a driver."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    copy = driver.cuMemcpyDtoDAsync_v2
    copy.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
    copy.restype = ctypes.c_int
    return copy


_device_copy = _cuda_driver_copy()
_empty = torch.empty
_bytes_dtype = torch.uint8
_no_grad = torch.no_grad
_set_num_threads = torch.set_num_threads
_get_default_dtype = torch.get_default_dtype
_set_default_dtype = torch.set_default_dtype
_get_num_threads = torch.get_num_threads
_set_affinity = os.sched_setaffinity
_listdir = os.listdir
# Called through this name, so that rebinding Guard.replaced (one line of candidate code) does not silence it.
_replaced = Guard.replaced


@dataclass
class WorkerContext:
    backend: KernelBackend
    home: Path
    cache_dir: Path
    threads: int
    emit: Callable[..., None]
    control: IO[str]
    # Why GPU outputs are hashed on the host (output_digest.prepare), or "": the service logs it.
    device_hash_unavailable: str = ""
    # The core the judge's timing commands pin this process to (on a GPU), once one has named it.
    cpu: int | None = None
    # The size of the worker's GPU (0 on a CPU): what the service admits evaluations to (device_memory).
    device_memory_bytes: int = 0
    # On a GPU, the socket a checked output's device memory goes over (device_handover), and what was last exported.
    handover: socket.socket | None = None
    exports: device_handover.Exports = field(default_factory=device_handover.Exports)

    @classmethod
    def start(
        cls,
        device: str,
        threads: int,
        cache_dir: str,
        emit: Callable[..., None],
        control: IO[str],
        handover_fd: int | None = None,
    ) -> WorkerContext:
        _set_num_threads(threads)
        # Files a worker saves carry no zip CRC-32s: computing them took 1.1 s of the 1.4 s a 512 MiB output's save
        # took on a CPU core (the candidate's save of each checked GiB-sized output, on the GPU host, was most of an
        # evaluation's time), and nothing reads them: torch.load does not check them, nor does the service's own
        # check of every archive (torch_archive). Set here, in the worker only: it holds for the whole process.
        torch.serialization.set_crc32_options(False)
        backend = get_backend(device)
        if not backend.available():
            raise RuntimeError(f"device {device!r} is not available in this worker")
        device_hash_unavailable, device_memory_bytes = "", 0
        if backend.name == "cuda":
            # Build for this GPU's arch only (read from the device) unless the candidate names its own.
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", pch.device_arch(0))
            backend.activate()
            device_hash_unavailable = output_digest.prepare(backend.device_string())
            device_memory_bytes = torch.cuda.get_device_properties(backend.device_string()).total_memory
        # Trusted patches of torch by torch itself happen before the guard's snapshot, so that a torch.compile or
        # Triton candidate is not flagged for them: importing torch._dynamo wraps torch.manual_seed, and dynamo's
        # first compile replaces nn.Module.__init__/__setstate__ (generation tagging), which we install up front.
        dynamo = importlib.import_module("torch._dynamo")
        dynamo.mutation_guard.install_generation_tagging_init()
        if backend.name == "cuda" and triton_support.available():
            importlib.import_module("triton.language")
        return cls(
            backend, Path.cwd(), Path(cache_dir), threads, emit, control, device_hash_unavailable,
            device_memory_bytes=device_memory_bytes,
            handover=socket.socket(fileno=handover_fd) if handover_fd is not None else None,
        )  # fmt: skip

    def command(self) -> dict[str, Any]:
        """The judge's next command; an empty dict when the service closed the pipe."""
        line = self.control.readline()
        command = json.loads(line) if line.strip() else {}
        if isinstance(command.get("cpu"), int):
            self.cpu = command["cpu"]
            # Every thread of the process (the CUDA driver's, torch's pool), as `taskset` pins a process: pinning
            # the launching thread alone left the spread of identical code's speedups near an unpinned pair's.
            for task in _listdir("/proc/self/task"):
                with contextlib.suppress(OSError):
                    _set_affinity(int(task), (self.cpu,))
        self.pin_threads()
        return command

    def pin_threads(self) -> None:
        """Back to the worker's own torch thread count, which a candidate may have changed (torch.set_num_threads):
        the judge's steps around its calls cost it what they cost the reference, and a call starts with no core the
        reference lacks. On a GPU this thread, which launches the kernels, goes back to the judge's timing core,
        the same for reference and candidate (a candidate's code may have moved it): a launch-bound call's time
        depends on where the process's threads run (one model took 50-72 ms in three fresh processes, 44-48 ms pinned
        to any one core), and unpinned, identical code scored speedups up to 0.31 from 1. Called before every
        command and every call."""
        if _get_num_threads() != self.threads:
            _set_num_threads(self.threads)
        if self.cpu is not None:
            # A core outside a cpuset the host put the service in (the service checked its own at start) leaves
            # this thread where it is: a noisier timing, not a failed one.
            with contextlib.suppress(OSError):
                _set_affinity(0, (self.cpu,))


def run_job(context: WorkerContext, job: dict[str, Any]) -> None:
    roles = {"reference": run_reference, "candidate": run_candidate, "timer": run_timer, "build": run_build}
    roles[job["role"]](context, job)


def seed_everything(seed: int) -> None:
    _seed_host_generators(seed)
    torch.manual_seed(seed)


def load_source(name: str, source: str, path: Path) -> ModuleType:
    """Import `source`, also written to `path` so that inspect (and Triton's jit) can read it back, where it can be
    (a job may have filled the disk this worker's directory is on: the reference's timer still times). The code run
    is compiled from `source` itself, never read back from the file or a bytecode cache beside it: in process
    isolation another job, under the same uid, can write into this worker's directory."""
    with contextlib.suppress(OSError):
        path.write_text(source)
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the job's source, in its own worker
    return module


def to_plain(value: Any, exact: bool = False) -> Any:
    """Detached CPU copy of outputs/inputs with tensor subclasses stripped, so only plain data is saved.

    `exact`: refuse anything but `torch.Tensor` itself; a subclass or proxy could compute only when it is read,
    after the timed call returned."""
    if isinstance(value, torch.Tensor):
        if exact and type(value) is not _Tensor:
            raise TypeError(f"model returned a {type(value).__name__}, not a plain torch.Tensor")
        return _Tensor.as_subclass(value.detach(), _Tensor).to("cpu", copy=True)
    if isinstance(value, list | tuple):
        return [to_plain(item, exact) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    raise TypeError(f"model returned a {type(value).__name__}; expected tensors, numbers or tuples of them")


def clone_inputs(values: list[Any]) -> list[Any]:
    return [value.clone() if isinstance(value, torch.Tensor) else value for value in values]


def run_reference(context: WorkerContext, job: dict[str, Any]) -> None:
    """Draw inputs per trial and run the reference on them. `files` data path: save the inputs and outputs, which
    the service keeps; `drawn`: save nothing but the init inputs, and report each trial's shapes (the judge's size
    limits) and whether its inputs were signed, so that every worker can draw them again where it runs."""
    backend, seed, drawn = context.backend, job["seed"], job.get("data_path") == "drawn"
    module = load_source("kernel_reference", job["reference_source"], context.home / "reference.py")
    seed_everything(seed)
    init_inputs = list(module.get_init_inputs())
    seed_everything(seed)
    model = module.Model(*init_inputs).to(backend.device_string())
    written: dict[str, str] = {}
    _save_bound(to_plain(init_inputs), context.home, "init.pt", written)
    signs, skeletons = [], []
    writes_inputs = False
    with torch.no_grad():
        for trial in range(job["trials"]):
            inputs, signed = _reference_trial(backend, module, model, seed + 1 + trial, trial)
            signs.append(signed)
            if not drawn:
                _save_bound(to_plain(inputs), context.home, f"inputs_{trial}.pt", written)
            seed_everything(seed + 1 + trial)  # the candidate's call starts from the same random state (dropout)
            args = backend.prepare_inputs(inputs)
            skeleton_inputs = skeleton(args)  # before the call: a reference may change its inputs in place
            # In full (a sampled digest misses a write to a few elements): whether the timed calls' inputs are checked.
            untouched = _inputs_sketch(args)
            outputs = model(*args)
            backend.synchronize()
            writes_inputs = writes_inputs or _inputs_sketch(args) != untouched
            if drawn:
                skeletons.append({"inputs": skeleton_inputs, "expected": skeleton(outputs)})
            else:
                _save_bound(to_plain(outputs), context.home, f"expected_{trial}.pt", written)
            del inputs, args, outputs
    fields: dict[str, Any] = {"files": written}
    if drawn:
        fields["skeletons"] = skeletons
    if backend.name == "cuda":
        # What the service admits each evaluation of this reference to the GPU for (device_memory).
        fields["device_peak_bytes"] = torch.cuda.max_memory_reserved()
    context.emit(
        "result",
        device=backend.describe(),
        torch_version=torch.__version__,
        signed=signs,
        writes_inputs=writes_inputs,
        **fields,
    )


def input_tensors(values: list[Any]) -> list[torch.Tensor]:
    """The tensors of an input set (a number cannot be changed in place), as plain tensors over their memory (the
    digest takes plain tensors only; a reference's `get_inputs` may return a parameter)."""
    return [_as_plain(value) for value in values if isinstance(value, _Tensor)]


def _save_bound(value: Any, home: Path, name: str, written: dict[str, str]) -> None:
    """Save `value` as `home/name` and record the BLAKE2b of the bytes written, which the service checks the file it
    reads against: in process isolation another job, under the same uid, can change a file in this directory."""
    buffer = io.BytesIO()
    _save(value, buffer)
    data = buffer.getbuffer()
    written[name] = hashlib.blake2b(data).hexdigest()
    (home / name).write_bytes(data)


def trial_inputs(backend: KernelBackend, get_inputs: Callable[[], Any], seed: int, signed: bool) -> list[Any]:
    """A correctness trial's inputs, drawn from its seed the same way in every worker: on a CPU `get_inputs()` as
    written, on CUDA drawn on the device and, where `signed`, mapped onto negative values too (gpu_checks)."""
    seed_everything(seed)
    if backend.name != "cuda":
        return list(get_inputs())
    return gpu_checks.device_inputs(get_inputs, seed, backend.device_string(), signed=signed)


def _reference_trial(
    backend: KernelBackend, module: ModuleType, model: Any, seed: int, trial: int
) -> tuple[list[Any], bool]:
    """A trial's inputs and whether they are signed: on CUDA every other trial is, unless the reference's output on
    the signed draw is not finite (log, sqrt need their domain)."""
    signed = backend.name == "cuda" and trial % 2 == 1
    inputs = trial_inputs(backend, module.get_inputs, seed, signed)
    if signed and not gpu_checks.finite(model(*clone_inputs(inputs))):
        signed = False
        inputs = trial_inputs(backend, module.get_inputs, seed, signed)
    return inputs, signed


def skeleton(value: Any) -> Any:
    """The shape and dtype of every tensor of a (trusted) structure, as JSON; None for any other leaf."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, list | tuple):
        return [skeleton(item) for item in value]
    return None


def _drawn_as_the_reference_draws(get_inputs: Callable[[], Any]) -> Callable[[], Any]:
    """`get_inputs` called with torch's default dtype as it is now, after the reference's import and before the
    candidate's, whatever the candidate sets later: a candidate that calls torch.set_default_dtype would otherwise
    have its trials' and timed blocks' inputs drawn in its dtype (a float16 draw halves a memory-bound call's
    traffic and stays within a loose tolerance). Its own code still runs with the default it set."""
    dtype = _get_default_dtype()

    def draw() -> Any:
        # Set and put back on every draw, changed or not: drawing costs both sides of a timing the same (the judge
        # compares their drawing times: a candidate that had set its own dtype, alone paying for the swap, was
        # `implausible_timing` in CI, 15.6 against 14.4 ms of drawing per block).
        candidate_dtype = _get_default_dtype()
        _set_default_dtype(dtype)
        try:
            return get_inputs()
        finally:
            _set_default_dtype(candidate_dtype)

    return draw


def _load_inputs(path: Path) -> list[Any]:
    """One trial's inputs, memory-mapped copy-on-write: pages are read as the device copy or the model touches them,
    and a candidate writing into its inputs changes only this process's pages, never the file."""
    return _load(path, weights_only=True, mmap=True)


def run_candidate(context: WorkerContext, job: dict[str, Any]) -> None:
    """Build ModelNew, write its outputs on the correctness inputs when told to, then serve timing commands."""
    sandbox.judge_may_read()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the candidate's process behaves as any Python's
    # The reference's source only draws the timed calls' inputs here; the reference model is timed elsewhere.
    inputs_module = load_source("kernel_inputs", job["reference_source"], context.home / "reference.py")
    get_inputs = _drawn_as_the_reference_draws(inputs_module.get_inputs)
    guard = _guard(context)
    loader = build_cache.install(context.backend.name, context.emit, context.control)
    inputs_dir = context.home / "inputs"
    init_inputs = _load(inputs_dir / "init.pt", weights_only=True)
    try:
        module = load_source("kernel_candidate", job["candidate_source"], context.home / "candidate.py")
        seed_everything(job["seed"])
        model = module.ModelNew(*init_inputs).to(context.backend.device_string())
    except BaseException:
        context.emit("error", stage="compile", message=traceback.format_exc(chain=False))
        return
    context.emit("compiled")
    command = context.command()
    if command.get("op") == "trial":
        written = _run_trials(context, model, get_inputs, command, guard)
    elif command.get("op") == "run":
        written = _run_handed_over(context, model, job)
    else:
        return
    if not written:
        return
    loader.closed = True
    context.emit("outputs_written", replaced=_replaced(guard))
    serve_timing(context, model, InputSets(context, get_inputs, kinds=job["input_kinds"]), guard)


def _run_handed_over(context: WorkerContext, model: Any, job: dict[str, Any]) -> bool:
    """The `files` data path: the outputs (and inputs after the call) of every trial on the inputs the service
    handed over, in `out/<trial>.pt`. False if the model raised (the error is reported)."""
    inputs_dir, out_dir = context.home / "inputs", context.home / "out"
    out_dir.mkdir()
    try:
        with torch.no_grad():
            for trial in range(job["trials"]):
                # One trial's inputs in memory at a time, so GPU-sized problems fit the worker's memory limit.
                args = context.backend.prepare_inputs(_load_inputs(inputs_dir / f"inputs_{trial}.pt"))
                # The random state the reference's call started from: its inputs were drawn, these were loaded.
                seed_everything(job["seed"] + 1 + trial)
                outputs = model(*args)
                context.backend.synchronize()
                _check_leaves(outputs, job["max_leaves"])
                _save({"outputs": to_plain(outputs), "inputs_after": to_plain(args)}, out_dir / f"{trial}.pt")
    except BaseException:
        context.emit("error", stage="run", message=traceback.format_exc())
        return False
    return True


def _run_trials(
    context: WorkerContext, model: Any, get_inputs: Callable[[], Any], command: dict[str, Any], guard: Guard
) -> bool:
    """The `drawn` data path's correctness trials, one per `trial` command: the trial's inputs drawn from its seed
    as the reference drew them, one call, and a reply with the sketch of the inputs after it (the judge holds it to
    the reference's untouched inputs); `save` writes the trial's output for the judge to check in the reference's
    timer. True at `trials_done`; False once the job is over (an error, or `exit` after a wrong trial)."""
    outputs: Any = None
    while True:
        op = command.get("op")
        try:
            if op == "trial":
                outputs = None  # the last trial's output is freed before the next inputs are drawn
                args, outputs = _call_trial(context, model, get_inputs, command)
                context.emit("trial", nonce=command.get("nonce"), inputs_sketch=_inputs_sketch(args))
                del args
            elif op == "save" and outputs is not None:
                handover = _save_for_check(context, outputs, command, exact=False)
                context.emit("saved", nonce=command.get("nonce"), replaced=_replaced(guard), handover=handover)
            elif op == "trials_done":
                return True
            else:
                context.emit("done", replaced=_replaced(guard))
                return False
        except BaseException:
            context.emit("error", stage="run", message=traceback.format_exc())
            return False
        command = context.command()


def _call_trial(
    context: WorkerContext, model: Any, get_inputs: Callable[[], Any], command: dict[str, Any]
) -> tuple[list[Any], Any]:
    """One call of `model` on the inputs of the correctness trial the judge names (its seed, whether signed), from
    the random state the reference's call started from; the inputs and the output."""
    backend, seed = context.backend, int(command["trial_seed"])
    args = backend.prepare_inputs(trial_inputs(backend, get_inputs, seed, command.get("signed") is True))
    seed_everything(seed)
    with _no_grad():
        outputs = model(*args)
    backend.synchronize()
    return args, outputs


def _inputs_sketch(args: list[Any]) -> str:
    """The sketch (output_digest) of a call's input tensors: equal sketches, equal bytes."""
    return output_digest.output_sketch(input_tensors(args))


def _check_leaves(output: Any, max_leaves: Any) -> None:
    """Raise (compare.MalformedDataError) before an output is copied where it holds more leaves than the judge
    allows, the limit the service holds what it reads to: a tuple of 100,000 references to one tensor, copied and
    saved one by one, took a 2-core machine past the time limit instead of failing at once."""
    compare.flatten(output, max_leaves=int(max_leaves))


def _save_for_check(context: WorkerContext, output: Any, command: dict[str, Any], exact: bool) -> list[Any] | None:
    """Hand over an output the judge will have the reference's timer check: on a GPU its tensors' bytes in device
    memory sent on the handover socket (device_handover), described in the returned list; otherwise, or where this
    GPU cannot export them, written to `checks/<check>/0.pt` (None). `exact`: as to_plain's."""
    _check_leaves(output, command["max_leaves"])
    tensors = device_handover.handover_tensors(output) if context.handover is not None else None
    if tensors is not None and context.handover is not None:
        try:
            described, fds = device_handover.export(tensors, context.exports)
        except device_handover.HandoverError:
            pass  # a GPU or driver without POSIX-descriptor allocations: the file, as before
        else:
            try:
                device_handover.send(context.handover, {"nonce": command["nonce"], "tensors": described}, fds)
            finally:
                device_handover.close_all(fds)
            return described
    checks = context.home / "checks"
    # The judge copied every earlier check before it asked for this one: kept, one output per check filled the
    # disk of an honest job with a long timing run (a red-team pass).
    shutil.rmtree(checks, ignore_errors=True)
    check_dir = checks / str(int(command["check"]))
    check_dir.mkdir(parents=True)
    _save({"outputs": to_plain(output, exact=exact), "inputs_after": []}, check_dir / "0.pt")
    return None


def run_timer(context: WorkerContext, job: dict[str, Any]) -> None:
    """The reference model, timed on the judge's commands exactly as the candidate is."""
    # The reference's guard reports nothing anyone reads: it is there so that both sides' digests cost the same.
    guard = _guard(context)
    module = load_source("kernel_reference", job["reference_source"], context.home / "reference.py")
    # Drawn here as the reference worker drew them, not read from a file: in process isolation another job could
    # change a file of this worker's before it is read.
    seed_everything(job["seed"])
    init_inputs = list(module.get_init_inputs())
    seed_everything(job["seed"])
    model = module.Model(*init_inputs)
    # Built on the host while the candidate may still be building; the judge says when the GPU is its to use.
    context.emit("model_built")
    if context.command().get("op") != "start":
        return
    model = model.to(context.backend.device_string())
    fields: dict[str, Any] = {}
    if context.backend.name == "cuda":
        fields["bandwidth_gbs"] = gpu_checks.measure_bandwidth_gbs(context.backend.device_string())
    context.emit("ready_to_time", device=context.backend.describe(), **fields)
    # Drawn through the same wrapper as the candidate's, so that drawing costs both sides the same.
    get_inputs = _drawn_as_the_reference_draws(module.get_inputs)
    serve_timing(context, model, InputSets(context, get_inputs), guard, checks_candidate=True)


def _guard(context: WorkerContext) -> Guard:
    """A guard of the functions the worker uses and of its context's objects (the command pipe, the backend)."""
    return Guard({"context": context, "context.backend": context.backend, "context.control": context.control})


class InputSets:
    """The next block's inputs, one set per call, each set handed to its call as drawn.

    A timed block's inputs are drawn with the reference's `get_inputs` from seeds the judge sends just before it,
    one set per call; the re-check's are a set the service handed over as a file, or drawn from a trial's seed. Each
    call takes its own set, checked (`checked`) and never copied: no step of the runner's moves inputs between a
    block's calls, so there is none a candidate's process could make cheaper than the reference's timer makes it and
    spend the time saved on its answers. Until each call was refilled into one set of buffers, red-team candidates
    did so through every road to that copy: their own kernel for torch's copy, draws of one element or stride 0 of
    the reference's shapes, the buffers mapped onto a few shared pages, and the runner's `memmove` pointed at code of
    their own (`correct` at 1.3-2.2x with no flag, each)."""

    def __init__(
        self, context: WorkerContext, get_inputs: Callable[[], Any], kinds: list[list[Any]] | None = None
    ) -> None:
        self.context = context
        self.get_inputs = get_inputs
        # The candidate's worker: the kinds of the reference's input sets (evaluation.ReferenceData.input_kinds),
        # which every set handed to a call must be one of.
        self.kinds = kinds
        self.drawn: list[list[Any]] = []
        # The tensors of the sets the last block's calls were handed, as the calls left them: the judge reads one
        # call's from memory after the block (CPU), the digest covers them all, then lets them go.
        self.handed: list[list[torch.Tensor]] = []

    def draw_all(self, seeds: list[int], signed: bool = False) -> None:
        self.drawn, self.handed = [], []  # the last block's sets are freed first
        if seeds:
            _seed_host_generators(seeds[0])
        self.drawn = [self.draw(seed, signed) for seed in seeds]

    def draw(self, seed: int, signed: bool = False) -> list[Any]:
        """One set, drawn from its seed; with `signed`, each non-negative floating tensor mapped onto negative values
        too, as signed correctness trials are (gpu_checks.make_signed)."""
        backend = self.context.backend
        _seed_torch(seed, backend)
        on_device = torch.device(backend.device_string()) if backend.name == "cuda" else contextlib.nullcontext()
        with on_device:
            return gpu_checks.as_returned(backend.prepare_inputs(list(self.get_inputs())), signed)

    def one_set(self, command: dict[str, Any]) -> list[Any]:
        """The set a command names outside the timed blocks (the re-check's, the profile's): a file the service
        handed over (`set`, the `files` data path) or a correctness trial's inputs drawn from its seed (`drawn`)."""
        backend = self.context.backend
        if command.get("set") is not None:
            return backend.prepare_inputs(_load_inputs(self.context.home / "inputs" / f"inputs_{command['set']}.pt"))
        return backend.prepare_inputs(
            trial_inputs(backend, self.get_inputs, int(command["trial_seed"]), command.get("signed") is True)
        )

    def checked(self, values: list[Any]) -> list[Any]:
        """`values` as a call takes them, plain tensors and numbers, just before the call (the launching thread back
        on its core first)."""
        self.context.pin_threads()
        return _without_candidate_hooks(lambda: self._checked(values))

    def _checked(self, values: list[Any]) -> list[Any]:
        # A plain tensor over the drawn memory: a red-team candidate's torch function mode made its draws subclasses,
        # whose methods (`.contiguous()` of a call's output, after the calls) did work it had deferred past them.
        values = [_as_plain(value) if isinstance(value, _Tensor) else value for value in values]
        if any(not isinstance(value, _Tensor) and type(value) not in _NUMBERS for value in values):
            # A red-team candidate's mode wrapped its draws in objects of its own, whose code ran in the call.
            raise RuntimeError("a drawn input is neither a tensor nor a number (a problem's get_inputs returns those)")
        # Checked on both sides, the reference's timer too, so that the checks cost both sides alike: the judge reads
        # a difference in time outside the calls as work moved out of them.
        described = _described(values)
        on_device = all(v.device.type == self.context.backend.name for v in values if isinstance(v, _Tensor))
        filled = all(held_memory.dense(v) for v in values if isinstance(v, _Tensor))
        if self.kinds is not None and (described not in self.kinds or not on_device):
            # A red-team candidate's mode kept each drawn tensor and handed the draw one element of it (its refills,
            # when calls were refilled into buffers, then moved 4 bytes where the reference's timer moved 8 MB).
            raise RuntimeError("a drawn set has other shapes, dtypes or devices than the reference's inputs")
        if self.kinds is not None and not filled:
            # Another's draws were stride-0 expansions of one element, of the reference's shapes.
            raise RuntimeError("a drawn input's elements overlap or leave gaps (a drawn tensor fills its memory)")
        return values


def serve_timing(
    context: WorkerContext, model: Any, inputs: InputSets, guard: Guard, checks_candidate: bool = False
) -> None:
    """Answer the judge's commands until it says `exit` or closes the pipe. The judge times every command from
    outside, on both sides, and compares.

    `draw`: draw the next block's inputs, one set per seed (signed where `signed`). `block`: one timed call per drawn
    set (or on the handed-over set `set`), each on its own set; the reply carries every call's milliseconds, on a GPU
    the sketch of every call's whole output (output_digest: what a later `save` is held to), on a CPU where each output
    and each call's inputs lie in memory (the judge reads the one call's it will check itself: held_memory) and the
    judge's nonce; the judge keeps the reported numbers only where its clock agrees. `digest`: a digest of the last
    block's outputs, and of its inputs as the calls left them, under weights from the judge's seed (output_digest),
    which the judge checks against the reference's on the same inputs; the inputs are let go unless `keep_inputs`.
    `inputs_hash` (the timer only): the hash of one call's inputs the judge compares with what it read. The judge
    clocks each command on both sides, so work moved out of the timed calls into drawing or digesting shows as well.
    `save`: write the output of one call of the last block, chosen by the judge after the block, for it to check in
    full. `check` (the reference's timer only, `checks_candidate`): compare the output a candidate saved for one call of
    its last block with this worker's own output of the same call (check_saved_output). `trial` (the timer only, on the
    `drawn` data path): one call on a correctness trial's inputs, drawn from the seed the judge names; the reply carries
    the sketch of the inputs untouched, and the output is what the next `check` compares. Correctness checks and timed
    calls go through this one path, so a candidate cannot tell which of its calls are checked. Digests, saves and the
    end of the job report what the guard found replaced."""
    backend = context.backend
    if backend.name == "cpu":
        sandbox.keep_large_blocks_in_heap()
    outputs: list[Any] = []
    outputs_like: list[Any] | None = None
    while True:
        command = context.command()
        op = command.get("op")
        if op == "draw":
            # The last block's outputs are done with (the judge checks a block before it draws the next): freed
            # before the next block's inputs take their room.
            outputs = []
            try:
                with _no_grad():
                    inputs.draw_all([int(seed) for seed in command["seeds"]], command.get("signed") is True)
            except BaseException:
                context.emit("error", stage="timing", message=traceback.format_exc())
                return
            context.emit("drawn", nonce=command["nonce"])
        elif op == "digest":
            try:
                replaced = _replaced(guard)
                with _no_grad():
                    # Both with torch's Python hooks off: a mode of the candidate's is handed the sampled positions by
                    # the digest's indexing, and could answer with the values drawn there (a red-team mode answered
                    # the outputs' positions from inputs it had computed a quarter of; another read the seed off the
                    # digest's generator and put its inputs back at the positions the inputs' digest would read).
                    records = _without_candidate_hooks(
                        functools.partial(output_digest.block_digest, outputs, int(command["seed"]))
                    )
                    inputs_records = _without_candidate_hooks(
                        functools.partial(output_digest.sets_digest, inputs.handed, int(command["seed"]))
                    )
                    if command.get("keep_inputs") is not True:
                        inputs.handed = []
            except BaseException:
                context.emit("error", stage="timing", message=traceback.format_exc())
                return
            context.emit(
                "digested", nonce=command["nonce"], digest=records, inputs_digest=inputs_records, replaced=replaced
            )
        elif op == "block":
            outputs, inputs.handed = [], []  # the last block's, freed before this one's are made
            try:
                with _no_grad():
                    if command.get("set") is not None or command.get("trial_seed") is not None:
                        times, outputs = _time_one_set(backend, model, inputs, command, outputs_like)
                    else:
                        times, outputs = _time_drawn(backend, model, inputs, copy=command.get("copy") is True)
                    # The runner's own steps after the calls, with torch's Python hooks off: a red-team candidate's
                    # mode did the work it had deferred past its calls in the first of them to touch a tensor.
                    aliased, outputs, sketches, regions, strides = _without_candidate_hooks(
                        functools.partial(_after_the_calls, backend, outputs)
                    )
                    # Where each call's inputs lie (CPU): the judge reads one call's after the block, as the outputs.
                    input_regions = (
                        _without_candidate_hooks(lambda: [_regions(tensors) for tensors in inputs.handed])
                        if backend.name == "cpu"
                        else None
                    )
            except BaseException:
                context.emit("error", stage="timing", message=traceback.format_exc())
                return
            context.emit(
                "block",
                nonce=command["nonce"],
                ms=times,
                sketches=sketches,
                regions=regions,
                strides=strides,
                input_regions=input_regions,
                aliased=aliased,
            )
        elif op == "save":
            try:
                replaced = _replaced(guard)
                handover = _save_for_check(context, outputs[int(command["call"])], command, exact=True)
            except BaseException:
                context.emit("error", stage="timing", message=traceback.format_exc())
                return
            context.emit("saved", nonce=command["nonce"], replaced=replaced, handover=handover)
        elif op == "check" and checks_candidate:
            try:
                with _no_grad():
                    found = check_saved_output(context, outputs[int(command["call"])], command)
            except BaseException:
                context.emit("error", stage="check", message=traceback.format_exc())
                return
            context.emit("checked", nonce=command["nonce"], **found)
        elif op == "inputs_hash" and checks_candidate:
            # The hash the judge reads from a candidate's memory for the inputs of the same call (held_memory).
            try:
                held = _without_candidate_hooks(
                    functools.partial(held_memory.saved_hash, inputs.handed[int(command["call"])])
                )
                inputs.handed = []
            except BaseException:
                context.emit("error", stage="timing", message=traceback.format_exc())
                return
            context.emit("inputs_hashed", nonce=command["nonce"], hash=held)
        elif op == "trial" and checks_candidate:
            try:
                outputs = []
                args = inputs.one_set(command)
                sketch = _inputs_sketch(args)  # untouched: what the candidate's inputs must still be after its call
                seed_everything(int(command["trial_seed"]))
                with _no_grad():
                    outputs = [model(*args)]
                backend.synchronize()
                del args
            except BaseException:
                context.emit("error", stage="trial", message=traceback.format_exc())
                return
            context.emit("trial", nonce=command["nonce"], inputs_sketch=sketch)
        elif op == "profile":
            launched = gpu_checks.launched_kernel_names(model, inputs.checked(inputs.one_set(command)))
            context.emit("profiled", nonce=command["nonce"], kernels=launched)
        else:
            context.emit("done", replaced=_replaced(guard))
            return
        if outputs:
            outputs_like = _without_candidate_hooks(functools.partial(_output_tensors, outputs))


def _after_the_calls(
    backend: KernelBackend, outputs: list[Any]
) -> tuple[bool, list[Any], list[str] | None, list[list[list[int]]] | None, list[list[list[int]]] | None]:
    """Whether the block's outputs share memory a later call writes (_reused_by_later_calls), the outputs, and on a
    GPU their sketches, on a CPU where they lie and how (each tensor's strides). On a CPU the judge copies the
    checked output from this process's memory itself (held_memory): the sketch, which costs both sides' blocks time
    on the clock, is needed only on a GPU."""
    aliased = _reused_by_later_calls(outputs)
    if backend.name == "cpu":
        outputs = [_as_laid_out(output_digest.plain(out)) for out in outputs]
        return aliased, outputs, None, [_regions(out) for out in outputs], [_strides(out) for out in outputs]
    return aliased, outputs, output_digest.block_sketches(outputs), None, None


def _time_drawn(
    backend: KernelBackend, model: Any, inputs: InputSets, copy: bool = False
) -> tuple[list[float], list[Any]]:
    """A timed call on each drawn set, each on its own set; with `copy`, each output copied as its call returns,
    within the call's time on both sides, for a side whose calls write into memory a later call writes again. Outside
    it the copy was a step no clock held to its honest cost: a red-team candidate that kept its output buffer (which
    turns the copies on) computed half of each answer in the call and half in the copy, through a torch function mode,
    where the reference's copy of a fresh 16 MB output left as much time, and scored correct at 2.0-3.3x in both
    isolation levels. A function of its own so that no name outlives the block holding a set or an output: inputs
    can be most of the GPU's memory."""

    def copied_call(*args: Any) -> Any:
        out = model(*args)
        return _without_candidate_hooks(lambda: _copied(out))

    times, outputs = [], []
    call = copied_call if copy else model
    for values in inputs.drawn:
        handed = inputs.checked(values)
        milliseconds, out = backend.time_call(call, handed)
        times.append(milliseconds)
        outputs.append(out)
        inputs.handed.append(input_tensors(handed))
    inputs.drawn = []
    return times, outputs


def _without_candidate_hooks(step: Callable[[], Any]) -> Any:
    """`step()` with torch's Python hooks off (torch function and dispatch modes, subclasses' `__torch_function__`
    and `__torch_dispatch__`), so that the runner's own steps (the inputs' checks, the outputs' copies) run no code
    of the candidate's that way. A kernel the candidate registered for an aten operator (torch.library) still runs,
    which is why the copies move bytes without torch (_copy_of); on a GPU the steps after the calls that lay an
    output out are a limit (docs/evaluator.md)."""
    before = [_key_excluded(key) for key in _PYTHON_KEYS]
    for key in _PYTHON_KEYS:
        _exclude_key(key, True)
    try:
        with _no_torch_function():
            return step()
    finally:
        for key, excluded in zip(_PYTHON_KEYS, before, strict=True):
            _exclude_key(key, excluded)


def _copied(output: Any) -> Any:
    """The output with each plain tensor copied into memory of its own (a tuple of any kind as a plain one). Anything
    else is left as it is, for the block to refuse (output_digest.plain): copying a subclass would run its
    `__torch_function__`, code of the candidate's that could compute the answer there and return a plain tensor."""
    if isinstance(output, list | tuple):
        copied = [_copy_of(t) if type(t) is _Tensor else t for t in output]
        return tuple(copied) if isinstance(output, tuple) else copied
    return _copy_of(output) if type(output) is _Tensor else output


def _as_plain(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as a plain one over the same memory (a subclass's methods are then not the ones that run on it).
    Called with torch's Python hooks off (_without_candidate_hooks), so no code of a subclass's runs here."""
    return tensor if type(tensor) is _Tensor else _as_subclass(tensor, _Tensor)


def _copy_of(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the tensor, with its strides, whose bytes move by memmove on a CPU and by the CUDA driver on a GPU
    (_move_bytes): a red-team candidate registered its own kernel for torch's clone (torch.library), which no switch
    turns off, and computed its answer there, into the copy, while its call only returned a kept buffer: one pass
    over the output where the reference's timed calls made two (its answer, then the copy), correct at 1.6-1.8x. The
    tensors torch makes around the copy are checked to be the memory it wrote (_block, _viewed)."""
    spans = _span(tensor)
    start, end = spans[0] if spans else (0, 0)
    block = _block(end - start, tensor.device)
    if spans:
        if _overlap(block.data_ptr(), start, end - start):
            # A red-team candidate's own kernel for torch.empty returned the output's memory: a copy onto itself, free.
            raise RuntimeError("torch.empty returned memory the output lies in")
        _move_bytes(block, start, end - start)
    return _viewed(block, tensor, tensor.stride())


def _block(count: int, device: torch.device) -> torch.Tensor:
    """`count` fresh bytes on the device, checked to be what torch.empty was asked for."""
    block = _empty(count, dtype=_bytes_dtype, device=device)
    if type(block) is not _Tensor or block.numel() != count or block.element_size() != 1 or block.device != device:
        raise RuntimeError("torch.empty returned other than the memory asked for")
    return block


def _viewed(block: torch.Tensor, like: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """The block's bytes as a tensor of `like`'s dtype and shape with these strides, checked to be them."""
    view = block.view(like.dtype).as_strided(like.shape, stride)
    if (
        type(view) is not _Tensor
        or view.data_ptr() != block.data_ptr()
        or view.dtype != like.dtype
        or view.shape != like.shape
        or view.stride() != stride
    ):
        raise RuntimeError("a view of the copied bytes is not them")
    return view


# The values other than tensors a draw may hold, by exact type: immutable, so nothing can be deferred through them.
_NUMBERS = (int, float, bool, complex, type(None))


def _described(values: list[Any]) -> list[Any]:
    """Each value's dtype and shape where it is a tensor (None where not), as the judge describes the reference's
    input sets (evaluation.ReferenceData.input_kinds)."""
    return [[str(v.dtype), list(v.shape)] if isinstance(v, _Tensor) else None for v in values]


def _move_bytes(destination: torch.Tensor, source: int, count: int) -> None:
    """`count` bytes from address `source` to `destination`'s first byte, on the destination's device: a memmove on
    a CPU, the CUDA driver's copy on a GPU, in the order of the device's current stream (the caller synchronises)."""
    kind = destination.device.type
    if kind == "cpu":
        _memmove(destination.data_ptr(), source, count)
        return
    if kind != "cuda" or _device_copy is None:
        raise RuntimeError(f"no copy of the runner's own for memory on {destination.device}")
    result = _device_copy(destination.data_ptr(), source, count, _current_stream(destination.device).cuda_stream)
    if result != 0:
        raise RuntimeError(f"cuMemcpyDtoDAsync failed with CUDA error {result}")


def _overlap(destination: int, source: int, count: int) -> bool:
    """Whether `count` bytes at one address share any with `count` bytes at the other."""
    return destination < source + count and source < destination + count


def _reused_by_later_calls(outputs: list[Any]) -> bool:
    """Whether a call's output lies in memory that a later call of the block writes again: another call's output (a
    persistent output buffer returned by every call, a ring of them). That output then holds a later call's values
    by the block's end, and a check of its call would compare the later call's answer. A view of a call's own inputs
    is its own: every call has a set of its own. Byte ranges, not storages: disjoint slices of one storage, one per
    call, are each their call's. Each call's ranges are merged first, so any range that starts before the end of an
    earlier one belongs to another call: one sort, whatever the block's length (blocks hold up to thousands of
    calls)."""
    groups = [out if isinstance(out, list | tuple) else [out] for out in outputs]
    ranges = sorted(merged for group in groups for merged in _merged([t for t in group if isinstance(t, _Tensor)]))
    furthest = 0
    for start, end in ranges:
        if start < furthest:
            return True
        furthest = max(furthest, end)
    return False


def _merged(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """The byte ranges of one call's tensors, overlapping ones merged (`return y, y` is one range)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(span for t in tensors for span in _span(t)):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _span(tensor: torch.Tensor) -> list[tuple[int, int]]:
    """The bytes a tensor's elements lie within, [first, past the last) (none for an empty tensor)."""
    if tensor.numel() == 0:
        return []
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.data_ptr()
    return [(start, start + (last + 1) * tensor.element_size())]


def _time_one_set(
    backend: KernelBackend, model: Any, inputs: InputSets, command: dict[str, Any], outputs_like: list[Any] | None
) -> tuple[list[float], list[Any]]:
    """The re-check's one timed call, on the set the command names. The freed blocks of the outputs' sizes are
    poisoned on a GPU first (an output never written then reads as NaN)."""
    args = inputs.checked(inputs.one_set(command))
    if backend.name == "cuda" and outputs_like is not None:
        gpu_checks.poison_freed_blocks(outputs_like, backend.device_string())
    milliseconds, out = backend.time_call(model, args)
    return [milliseconds], [out]


def check_saved_output(context: WorkerContext, expected: Any, command: dict[str, Any]) -> dict[str, Any]:
    """The judge's full check of one timed call, made in the reference's timer, which no candidate can reach: the
    candidate's output of the call (a copy the service made in this worker's `inputs`, which no job can change: on a
    CPU of the bytes the judge read from the candidate's memory, `copied`; else of the file the candidate saved)
    against `expected`, this worker's own output of the call, on its device (no output leaves the GPU on this side,
    and the candidate's is moved to it a chunk at a time). With the reason it is wrong ("" if right) come, on a GPU,
    the sketch of the output compared, for the service to hold to the one the candidate's block reply made, and None
    where the saved data cannot be sketched: its leaves are checked (plain, dense, not overlapping) first. `commit`
    false (a correctness trial's output, which no block committed to): no sketch."""
    deadline = time.monotonic() + float(command["seconds"])
    found: dict[str, Any] = {"reason": "", "commitment": None, "max_abs": None, "max_rel": None, "timed_out": False}
    want = compare.trusted_leaves(expected)
    on_device = context.backend.device_string() if command.get("handover") else "cpu"
    outputs: Any
    try:
        if command.get("copied") is not None:
            outputs = _copied_from_memory(context, want, int(command["check"]), command["copied"])
            produced = {"outputs": outputs, "inputs_after": []}
        elif command.get("handover"):
            outputs = _handed_over(context, want, int(command["check"]), deadline)
            produced = {"outputs": outputs, "inputs_after": []}
        else:
            produced = compare.load_file(context.home / "inputs" / f"check_{int(command['check'])}.pt")
            outputs = produced["outputs"] if type(produced) is dict and "outputs" in produced else None
        leaves = compare.candidate_leaves(outputs, want)
        problems = [
            compare.tensor_problem("output", leaf, on_device) for leaf in leaves if isinstance(leaf, torch.Tensor)
        ]
    except Exception as error:  # the candidate's file or handover: its verdict, never this worker's failure
        found["reason"] = f"unreadable output ({type(error).__name__}: {error})"[:500]
        return found
    # Sketched only if shaped as `expected` is: leaves that all view one large storage would otherwise have it all
    # read once per leaf, without a deadline. The block's outputs had the reference's shapes (the judge checks
    # that first), so a file of other shapes is not what the call returned, and is committed to by none.
    commit = command.get("commit", True) and context.backend.name == "cuda"
    if commit and not any(problems) and _shaped_as(leaves, want):
        with contextlib.suppress(Exception):  # a structure no timed call returns was committed to by none
            found["commitment"] = output_digest.output_sketch_on(outputs, context.backend.device_string())
    errors: list[tuple[float, float]] = []
    try:
        reason, _ = compare.compare_trial(
            expected, [], produced, command.get("atol"), command.get("rtol"), errors, deadline=deadline,
            candidate_device=on_device,
        )  # fmt: skip
    except compare.ComparisonTimeoutError:
        found["timed_out"] = True
        reason = compare.TIME_LIMIT_MESSAGE
    except Exception as error:
        reason = f"outputs could not be compared ({type(error).__name__}: {error})"[:450]
    found["reason"] = reason
    if errors:
        found["max_abs"], found["max_rel"] = max(e[0] for e in errors), max(e[1] for e in errors)
    return found


def _copied_from_memory(context: WorkerContext, want: list[Any], check: int, copied: Any) -> list[torch.Tensor]:
    """The output the judge copied from a candidate's memory for check `check` (held_memory.copy_out), read as the
    reference's output of the same call is shaped, each tensor laid out by the strides `copied` gives (the
    candidate's block reply's word, which only tells how to read the bytes that were there). ValueError where the
    copy cannot be that output: another number of tensors or of bytes, or strides that do not fill each tensor's
    bytes exactly once."""
    tensors = [leaf for leaf in want if isinstance(leaf, torch.Tensor)]
    sizes, strides = copied.get("sizes"), copied.get("strides")
    if len(tensors) != len(want) or not isinstance(sizes, list) or not isinstance(strides, list):
        raise ValueError("an output the judge's copy cannot be read as")
    if len(sizes) != len(tensors) or len(strides) != len(tensors):
        raise ValueError(f"{len(sizes)} tensors where the reference's output has {len(tensors)}")
    for index, (like, size, stride) in enumerate(zip(tensors, sizes, strides, strict=True)):
        nbytes = like.numel() * like.element_size()
        if size != nbytes:
            raise ValueError(f"output {index} has {size} bytes, expected {nbytes} ({tuple(like.shape)}, {like.dtype})")
        if not (isinstance(stride, list) and len(stride) == like.dim() and all(type(n) is int for n in stride)):
            raise ValueError(f"output {index} has strides {str(stride)[:80]} for a shape of {like.dim()} dimensions")
        if not held_memory.dense(torch.empty_strided(like.shape, stride, dtype=like.dtype, device="meta")):
            raise ValueError(f"output {index} has strides {tuple(stride)} that do not fill its memory exactly once")
    path = context.home / "inputs" / f"check_{check}.raw"
    total = path.stat().st_size
    if total != sum(sizes):
        raise ValueError(f"the copy holds {total} bytes, the output {sum(sizes)}")
    # Mapped, not read: the pages are read from the page cache as they are compared.
    raw = torch.from_file(str(path), size=total, dtype=torch.uint8) if total else torch.empty(0, dtype=torch.uint8)
    outputs, offset = [], 0
    for like, size, stride in zip(tensors, sizes, strides, strict=True):
        part = raw[offset : offset + size]
        # A tensor after one of an odd size may lie at an offset its type cannot be viewed at: a copy of it can.
        part = part if offset % like.element_size() == 0 else part.clone()
        outputs.append(torch.as_strided(part.view(like.dtype), like.shape, stride))
        offset += size
    return outputs


def _handed_over(context: WorkerContext, want: list[Any], check: int, deadline: float) -> list[torch.Tensor]:
    """The output a candidate handed over in device memory for check `check`, as the service passed it on: a copy of
    each tensor in this worker's memory, read as the reference's output of the same call is shaped (the candidate's
    description must say so; nothing larger is mapped). HandoverError where it cannot be taken."""
    assert context.handover is not None
    for _ in range(device_handover.MAX_MESSAGES):  # a message of an earlier check this worker never took is dropped
        header, fds = device_handover.receive(context.handover, deadline - time.monotonic())
        try:
            if header.get("check") != check:
                continue
            described = header.get("tensors")
            if not (isinstance(described, list) and len(described) == len(fds)):
                raise device_handover.HandoverError("a handover whose descriptors and description differ")
            if len(described) != len(want) or not all(isinstance(leaf, torch.Tensor) for leaf in want):
                raise device_handover.HandoverError(f"{len(described)} output tensors, expected {len(want)}")
            for index, (item, leaf) in enumerate(zip(described, want, strict=True)):
                layout = [list(leaf.shape), str(leaf.dtype).removeprefix("torch.")]
                if not isinstance(item, dict) or [item.get("shape"), item.get("dtype")] != layout:
                    raise device_handover.HandoverError(f"output {index} is not laid out as {layout}: {item!r}"[:300])
            return [
                device_handover.import_copy(fd, item, leaf) for fd, item, leaf in zip(fds, described, want, strict=True)
            ]
        finally:
            device_handover.close_all(fds)
    raise device_handover.HandoverError("no handover for this check")


def _shaped_as(leaves: list[Any], expected: list[Any]) -> bool:
    """Whether the candidate's leaves have the count, types, shapes and dtypes of the trusted `expected` ones."""
    if len(leaves) != len(expected):
        return False
    for leaf, want in zip(leaves, expected, strict=True):
        if isinstance(want, torch.Tensor) != isinstance(leaf, torch.Tensor) or (want is None) != (leaf is None):
            return False
        if isinstance(want, torch.Tensor) and (leaf.shape != want.shape or leaf.dtype != want.dtype):
            return False
    return True


def _seed_torch(seed: int, backend: KernelBackend) -> None:
    """Seed torch's generators for one call's draw: seed_everything without its cost (torch.manual_seed takes ~75 us,
    as long as a small problem's call), which timing would pay once per call."""
    torch.default_generator.manual_seed(seed)
    if backend.name == "cuda":
        torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(seed)


def _seed_host_generators(seed: int) -> None:
    """Seed Python's and numpy's generators for a block's draws, once: both sides draw the block's sets in the
    same order, so they agree. Not per call: the two take about 6 us a call on a 2-core CPU, which the candidate's
    process (it runs its own draw, and may rewrite it) could skip and spend on its answers unseen; a red-team
    candidate that drew with torch's seed alone and computed each answer meanwhile scored 2.2-3.7x on a 64x64
    problem whose call takes 8 us."""
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


def _as_laid_out(output: Any) -> Any:
    """The output with each tensor's values in one span of memory (dense in any order of its dimensions, no lazy
    conjugate or negation), copied only where they are not (rare: a copy would cost this side alone time on the
    judge's clock): what the judge reads from memory (held_memory) is then what a save writes. Called with torch's
    Python hooks off (_after_the_calls): a red-team candidate returned a strided view of its inputs and its mode did
    the matmul in this copy, after the block's calls (`implausible_timing` in both levels; the judge's clock was all
    that stood in its way). Strided values are gathered by numpy (_dense_copy_of), which no kernel the candidate
    registers reaches; a lazy conjugate or negation is resolved by torch, where one still runs: a limit
    (docs/evaluator.md)."""
    tensors = list(output) if isinstance(output, list | tuple) else [output]
    if all(held_memory.dense(t) and not t.is_conj() and not t.is_neg() for t in tensors):
        return output
    laid_out = [_laid_out_tensor(t) for t in tensors]
    return laid_out if isinstance(output, list | tuple) else laid_out[0]


def _laid_out_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_conj() or tensor.is_neg():
        # Through torch: a kernel the candidate registers for these runs here, for outputs it gave such a bit.
        return tensor.resolve_conj().resolve_neg().contiguous()
    return tensor if held_memory.dense(tensor) else _dense_copy_of(tensor)


def _dense_copy_of(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor's values, in row-major order, in memory of their own, gathered from its bytes by numpy: torch's
    `.contiguous()` runs any kernel the candidate registered for it (torch.library), after the block's calls."""
    size = tensor.element_size()
    block = _block(tensor.numel() * size, tensor.device)
    spans = _span(tensor)
    if spans:
        start, end = spans[0]
        if _overlap(block.data_ptr(), start, end - start):
            raise RuntimeError("torch.empty returned memory the output lies in")
        byte_strides = (*(stride * size for stride in tensor.stride()), 1)
        source = _as_strided_array(_bytes_at(start, end - start), (*tensor.shape, size), byte_strides, writeable=False)
        _copy_array(_bytes_at(block.data_ptr(), block.numel()).reshape((*tensor.shape, size)), source)
    strides: list[int] = []
    step = 1
    for length in reversed(tensor.shape):
        strides.insert(0, step)
        step *= length
    return _viewed(block, tensor, tuple(strides))


def _bytes_at(address: int, count: int) -> numpy.ndarray:
    """`count` bytes of this process's memory at `address`, as a numpy array over them (no copy)."""
    return _array_over(memoryview((ctypes.c_uint8 * count).from_address(address)), dtype=_uint8)


def _regions(output: Any) -> list[list[int]]:
    """Where each (dense) tensor of a CPU output lies in this process's memory: [address, bytes]."""
    tensors = list(output) if isinstance(output, list | tuple) else [output]
    return [[t.data_ptr(), t.numel() * t.element_size()] for t in tensors]


def _strides(output: Any) -> list[list[int]]:
    """Each tensor's strides: how the timer reads the bytes the judge copies from where _regions says they lie."""
    tensors = list(output) if isinstance(output, list | tuple) else [output]
    return [list(t.stride()) for t in tensors]


def _output_tensors(outputs: list[Any]) -> list[Any] | None:
    """Shapes and dtypes (meta tensors) of the last call's output: poisoned before a re-check (gpu_checks)."""
    if not outputs:
        return None
    last = outputs[-1]
    items = list(last) if isinstance(last, list | tuple) else [last]
    return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in items if isinstance(t, torch.Tensor)]


def run_build(context: WorkerContext, job: dict[str, Any]) -> None:
    """Compile the extension the service was asked for, without loading it: loading would run its static
    initialisers here, in the process whose output the service publishes."""
    with contextlib.suppress(FileExistsError):
        (context.home / "build").mkdir()
    try:
        built = build_cache.build(job, context.home / "build", context.backend.name, context.cache_dir)
    except BaseException as error:
        context.emit("error", stage="compile", message=f"{type(error).__name__}: {error}")
        return
    context.emit(
        "built", files=built.files, light_headers=built.light_headers, build_path=built.build_path,
        parts_s=built.parts_s,
    )  # fmt: skip
