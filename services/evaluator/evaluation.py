"""One evaluation, start to finish, run by the judge: the service process, which the candidate cannot reach.

Static checks, the reference worker (inputs and expected outputs), the candidate worker (its extension builds
done by a trusted builder), comparison, and timing against a reference timer worker: every command is sent by
the judge, every reply checked, and every timed block of calls measured from outside as well. See
docs/evaluator.md for the threat model.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import math
import os
import secrets
import signal
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
from cachetools import LRUCache

from services.evaluator import (
    build_cache,
    device_handover,
    gpu_checks,
    held_memory,
    output_digest,
    sandbox,
    split_build,
)
from services.evaluator.backends import BACKENDS, get_backend, resolve_device
from services.evaluator.compare import (
    MAX_LEAVES,
    TIME_LIMIT_MESSAGE,
    Comparison,
    compare_outputs,
    error_maxima,
    load_data,
    output_size_limit,
    trusted_leaves,
)
from services.evaluator.config import HACK_FLAGS, Settings
from services.evaluator.device_memory import GIB, DoesNotFitError, evaluation_need
from services.evaluator.metrics import Metrics
from services.evaluator.pool import QueueFullError, Worker, WorkerPool, WorkerStartError
from services.evaluator.safe_files import copy_file_beneath, open_beneath, read_file_beneath
from services.evaluator.sandbox import write_readonly_file
from services.evaluator.static_checks import check_candidate, reference_problems
from services.evaluator.verdict import (
    CandidateRun,
    TimingResult,
    candidate_result,
    needs_whole_rebuild,
    printable,
    truncate,
)
from shared.contracts import EvaluateRequest, EvaluationResult, EvaluationStatus

log = logging.getLogger(__name__)
# What _read_held found in a worker's memory.
_Found = TypeVar("_Found")

# Reference outputs larger than this are not kept in memory between requests.
MAX_CACHED_REFERENCE_BYTES = 256 << 20
# The reference draws one input set more than the correctness trials: the candidate sees it only after timing.
RECHECK_SETS = 1
# CPU a stopped job's processes may show between the judge's two readings (none, but for the kernel's leftovers
# from stopping) before the job is taken to have run meanwhile.
RAN_WHILE_STOPPED_S = 0.002
# The candidate's time not explained by its report may exceed the reference's (median per block) by this share of
# the block's wall time plus this many seconds, or by less than chance under load allows (a one-sided rank test at
# this z, about p = 0.001); more means work the report hides (another stream, a false report).
UNEXPLAINED_SHARE = 0.05
UNEXPLAINED_SLACK_S = 0.0002
# The judge's clock replaces a report that falls short of it by more than this many median absolute deviations of
# the reference's overhead, plus CLOCKED_SHARE of the block, plus the slack (judge_room_s).
JITTER_FACTOR = 3.0
CLOCKED_SHARE = 0.10
UNEXPLAINED_Z = 3.09
# The candidate's draws are charged to it where they rank above the reference's at this z (one-sided p = 0.05).
CHARGE_Z = 1.64
# The same for the candidate's slowest blocks above all of the reference's (_slower_beyond_chance).
SLOWEST_BLOCKS_P = 0.001
# Timing rounds: while the judge's noise is too large against the candidate's blocks, the next round has longer
# blocks; an implausible-timing flag stands only in the last round it reaches.
TIMING_ROUNDS = 3
# A round is started only where this many times its estimated length is left before the deadline (the rest holds
# the re-check and the reply).
ROUND_MARGIN = 1.5
# The room a report has below the judge's clock, as a share of the candidate's own time per block, at most.
MAX_ROOM_SHARE = 0.25
# The input sets and outputs a worker holds for one timed block take at most 1/this of its memory limit.
BLOCK_MEMORY_SHARE = 8
# Most calls in one timed block, and the longest a block grows to (by the wall clock, its drawing and digest included).
MAX_BLOCK_CALLS = 10_000
MAX_BLOCK_S = 0.25
# How long a timed block of the reference lasts at least, by default (EVALUATOR_MIN_SAMPLE_MS). On a GPU the judge's
# clock is the wall time around the block, and with 16 evaluations on the host its jitter is milliseconds: 5 ms
# blocks leave the clock too little resolution, and each round of longer blocks that follows costs a round.
MIN_SAMPLE_MS_CPU = 5.0
MIN_SAMPLE_MS_GPU = 20.0
# Fewest timed blocks (samples) a round has where `timing_trials` allows. A candidate that moves its work out of the
# timed calls in just over half of its blocks sets the median, and so its speedup: at 20 blocks a side the rank test
# of all pairs cannot see that half (z of 2.96 for 11 of 20), the test of the slowest blocks can (_slower_beyond_chance).
MIN_TIMED_BLOCKS = 20


class InvalidRequestError(ValueError):
    """The request cannot be evaluated as sent (HTTP 422): bad reference, unknown or absent device."""


class EvaluatorFailure(RuntimeError):  # noqa: N818 - a verdict, not a programming error
    """The evaluator could not score the candidate; becomes an `evaluator_error` result."""


@dataclass
class ReferenceData:
    """What the reference worker produced; the outputs never leave the service process. On the `drawn` data path
    no data: `inputs` and `expected` are meta tensors of the right shapes (for size limits), `input_bytes` empty,
    and each trial's inputs are drawn again from its seed, signed where `signed` says."""

    init_bytes: bytes
    input_bytes: list[bytes]
    inputs: list[list[Any]]
    expected: list[Any]
    device: str
    torch_version: str
    signed: list[bool]
    data_path: str
    # What the reference's run peaked at on its GPU (torch's reserved memory; 0 on a CPU): each evaluation's
    # device memory is admitted from it (device_memory).
    device_peak_bytes: int = 0
    # Whether a trial's call changed its inputs (in place): a timed call's inputs are then not checked for changes.
    writes_inputs: bool = False

    @functools.cached_property
    def max_output_leaves(self) -> int:
        """Most leaves a candidate's output may have, which its worker is told (compare.candidate_leaves allows
        each trial as many as the reference's where those exceed MAX_LEAVES; this is their most over the trials).
        Walked once per reference, which every evaluation of it shares, not at each of its checks' saves."""
        return max([MAX_LEAVES, *(len(trusted_leaves(expected)) for expected in self.expected)])

    @functools.cached_property
    def input_kinds(self) -> list[list[Any]]:
        """The kinds of the trials' input sets, each once: per value, a tensor's dtype and shape, None for a number.
        Every set the candidate's worker draws for a timed call must be one of them (runner.InputSets)."""
        kinds: list[list[Any]] = []
        for values in self.inputs:
            kind = [[str(v.dtype), list(v.shape)] if isinstance(v, torch.Tensor) else None for v in values]
            if kind not in kinds:
                kinds.append(kind)
        return kinds

    @property
    def size(self) -> int:
        """Bytes held in memory (inputs twice: serialised and loaded; meta tensors hold none)."""
        held = 0 if self.data_path == "drawn" else _nbytes(self.expected)
        return len(self.init_bytes) + 2 * sum(map(len, self.input_bytes)) + held


class Evaluator:
    """Runs evaluations on a WorkerPool; plain asyncio, no FastAPI."""

    def __init__(self, settings: Settings, pool: WorkerPool, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        # Least recently used first out; a size of 0 turns the cache off (checked where references are stored).
        self._references: LRUCache[str, ReferenceData] = LRUCache(maxsize=max(1, settings.reference_cache_size))
        # Runs in progress, shared by concurrent requests for the same thing: a reference (a trainer sends a whole
        # GRPO group with one seed at once) or an extension build (a group often writes one kernel).
        self._computing: dict[str, asyncio.Future[Any]] = {}

    def validate(self, request: EvaluateRequest) -> str:
        """Raise InvalidRequestError for a request that cannot be evaluated; return the backend name to use."""
        problems = reference_problems(request.reference_source)
        if problems:
            raise InvalidRequestError("; ".join(problems))
        device = resolve_device(request.device)
        if device not in BACKENDS or not get_backend(device).available():
            raise InvalidRequestError(
                f"device {request.device!r} is not available on this evaluator "
                f"(available: {', '.join(d for d in BACKENDS if get_backend(d).available())})"
            )
        return device

    async def evaluate(self, request: EvaluateRequest, on_start: Callable[[], None] | None = None) -> EvaluationResult:
        """Score one candidate; `on_start` is called when it leaves the queue. Raises InvalidRequestError, QueueFullError."""
        start = time.monotonic()
        device = self.validate(request)
        seed = request.seed if request.seed is not None else secrets.randbelow(2**31)
        try:
            result = await self._evaluate(request, device, seed, on_start)
        except QueueFullError:
            raise
        except (EvaluatorFailure, WorkerStartError) as exc:
            result = _bare(EvaluationStatus.evaluator_error, truncate(str(exc), self.settings.message_chars))
        except Exception as exc:
            log.exception("evaluation failed")
            result = _bare(EvaluationStatus.evaluator_error, f"internal error: {type(exc).__name__}")
        result = result.model_copy(
            update={
                "seed": seed,
                "duration_s": time.monotonic() - start,
                "torch_version": result.torch_version or torch.__version__,
                "device": result.device or device,
            }
        )
        if self.metrics is not None:
            self.metrics.record(result)
        # One line per evaluation: where a batch stands and where its time went, without asking for each job.
        log.info(
            "evaluated: %s in %.1f s, flags %s, build %s, phases %s",
            result.status.value,
            result.duration_s,
            ",".join(result.flags) or "none",
            result.build_path or "none",
            " ".join(f"{phase}={seconds:.1f}" for phase, seconds in result.phases_s.items()),
        )
        return result

    async def _evaluate(
        self, request: EvaluateRequest, device: str, seed: int, on_start: Callable[[], None] | None
    ) -> EvaluationResult:
        check = check_candidate(request.candidate_source, request.require_custom_kernel)
        if check.syntax_error:
            return _bare(EvaluationStatus.compile_error, check.syntax_error)
        if not check.defines_model_new:
            return _bare(EvaluationStatus.compile_error, "candidate_source does not define ModelNew")
        rejecting = [flag for flag in check.flags if flag in self.settings.reject_flags]
        if rejecting:
            return _bare(
                EvaluationStatus.rejected,
                f"rejected before running for {', '.join(rejecting)}",
                flags=sorted(check.flags),
            )
        queued_at = time.monotonic()
        async with self.pool.slot():
            if on_start is not None:
                on_start()
            started = time.monotonic()
            deadline = started + (request.timeout_s or self.settings.default_timeout_s)
            reference = await self._reference(request, device, seed, deadline)
            judged_at = time.monotonic()
            phases = {"queued": started - queued_at, "reference": judged_at - started}
            # The candidate's time limit starts now: the reference's run (or the wait for one in progress) is not its.
            deadline = judged_at + (request.timeout_s or self.settings.default_timeout_s)
            judge = Judge(self, request, device, seed, deadline, reference, check.flags, split_build.enabled())
            run = await judge.run()
            result = candidate_result(run, self.settings.reject_flags, self.settings.message_chars)
            if needs_whole_rebuild(result):
                phases["split_run"] = time.monotonic() - judged_at
                result, run = await self._rebuild_whole(judge, result, run)
        return result.model_copy(
            update={
                "device": reference.device,
                "torch_version": reference.torch_version,
                "phases_s": {name: round(seconds, 4) for name, seconds in {**phases, **run.phases}.items()},
            }
        )

    async def _rebuild_whole(
        self, split_judge: Judge, split_result: EvaluationResult, split_run: CandidateRun
    ) -> tuple[EvaluationResult, CandidateRun]:
        """Evaluate a split-built candidate again with every extension built whole; the final result (`build_path`
        `fallback`) and the run it came from. The whole run gets the request's whole time limit from its own start,
        as it would have had with split builds off, so its verdict is the one a whole-only evaluator would give,
        `timeout` included: a split-built run that fails can make an evaluation take up to twice its limit, never
        change its verdict."""
        limit_s = split_judge.request.timeout_s or self.settings.default_timeout_s
        whole_judge = Judge(
            self, split_judge.request, split_judge.device, split_judge.seed, time.monotonic() + limit_s,
            split_judge.reference, split_run.static_flags, allow_split=False,
        )  # fmt: skip
        run = await whole_judge.run()
        result = candidate_result(run, self.settings.reject_flags, self.settings.message_chars)
        return result.model_copy(update={"build_path": "fallback"}), run

    async def shared(self, key: str, compute: Callable[[], Any]) -> Any:
        """Await `compute()` once per key among concurrent callers (a cancelled first caller hands it on)."""
        while True:
            pending = self._computing.get(key)
            if pending is None:
                break
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request was cancelled, not the one computing
        computing: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._computing[key] = computing
        try:
            value = await compute()
        except asyncio.CancelledError:
            computing.cancel()
            raise
        except BaseException as exc:
            computing.set_exception(exc)
            computing.exception()  # retrieved: nobody may be waiting
            raise
        else:
            computing.set_result(value)
        finally:
            del self._computing[key]
        return value

    async def _reference(self, request: EvaluateRequest, device: str, seed: int, deadline: float) -> ReferenceData:
        trials = request.correctness_trials + RECHECK_SETS
        data_path = self.settings.data_path_for(device)
        key = hashlib.sha256(
            f"{device}\0{seed}\0{trials}\0{data_path}\0{request.reference_source}".encode()
        ).hexdigest()
        cached = self._references.get(key)
        if cached is not None:
            return cached
        reference: ReferenceData = await self.shared(
            f"reference:{key}", lambda: self._run_reference(request, device, seed, trials, data_path, deadline)
        )
        if 0 < reference.size <= MAX_CACHED_REFERENCE_BYTES and self.settings.reference_cache_size > 0:
            self._references[key] = reference
        return reference

    async def _run_reference(
        self, request: EvaluateRequest, device: str, seed: int, trials: int, data_path: str, deadline: float
    ) -> ReferenceData:
        if self.metrics is not None:
            self.metrics.reference_runs.inc()
        job = {
            "role": "reference", "reference_source": request.reference_source, "seed": seed, "trials": trials,
            "data_path": data_path,
        }  # fmt: skip
        gpu = self.pool.placement(device)
        async with self._whole_device(gpu) as waited, self.pool.worker(device, gpu) as worker:
            deadline += waited
            await worker.send(job)
            outcome = await worker.finish(deadline)
            error = worker.find("error")
            if outcome.timed_out:
                raise EvaluatorFailure("the reference did not finish within the time limit")
            if error is not None or worker.find("result") is None:
                detail = error.get("message", "") if error else f"{outcome.describe_exit()}\n{outcome.stdio_tail}"
                raise EvaluatorFailure(f"the reference failed: {detail}")
            return await asyncio.to_thread(self._read_reference, worker, trials, data_path)

    @contextlib.asynccontextmanager
    async def _whole_device(self, gpu: str | None) -> AsyncIterator[float]:
        """The whole of `gpu` (nothing on a CPU), for a reference's run: how much device memory an evaluation of it
        needs is what the run will tell. No model of another evaluation runs on the GPU meanwhile. Yields the
        seconds waited."""
        if gpu is None:
            yield 0.0
            return
        async with self.pool.device_memory[gpu].reserve(None, "the reference's run") as waited:
            yield waited

    def _read_reference(self, worker: Worker, trials: int, data_path: str) -> ReferenceData:
        result = worker.find("result") or {}
        limit = self.settings.max_file_mb << 20

        written = result.get("files")

        def read(name: str) -> bytes:
            data = read_file_beneath(worker.root, f"home/{name}", limit, worker.uid)
            # The bytes the reference worker wrote (its channel is out of every job's reach; its files, in process
            # isolation, are not).
            if not isinstance(written, dict) or written.get(name) != hashlib.blake2b(data).hexdigest():
                raise ValueError(f"{name} is not the file the reference worker wrote")
            return data

        try:
            init_bytes = read("init.pt")
            signed = result.get("signed")
            if not (isinstance(signed, list) and len(signed) == trials and all(type(s) is bool for s in signed)):
                raise ValueError("no sign for every trial")
            peak = result.get("device_peak_bytes", 0)
            if type(peak) is not int or peak < 0:
                raise ValueError(f"a malformed device peak {peak!r}"[:200])
            writes_inputs = result.get("writes_inputs")
            if type(writes_inputs) is not bool:
                raise ValueError("no word on whether the reference writes its inputs")
            if data_path == "drawn":
                input_bytes: list[bytes] = []
                skeletons = result.get("skeletons")
                if not (isinstance(skeletons, list) and len(skeletons) == trials):
                    raise ValueError("no shapes for every trial")
                inputs = [from_skeleton(shapes["inputs"]) for shapes in skeletons]
                expected = [from_skeleton(shapes["expected"]) for shapes in skeletons]
            else:
                input_bytes = [read(f"inputs_{t}.pt") for t in range(trials)]
                expected = [load_data(read(f"expected_{t}.pt")) for t in range(trials)]
                inputs = [load_data(data) for data in input_bytes]
        except Exception as exc:
            raise EvaluatorFailure(f"the reference's outputs are unreadable: {type(exc).__name__}: {exc}") from exc
        return ReferenceData(
            init_bytes, input_bytes, inputs, expected, str(result.get("device", "")), str(result.get("torch_version")),
            signed, data_path, peak, writes_inputs,
        )  # fmt: skip


def from_skeleton(value: Any) -> Any:
    """Meta tensors of the shapes and dtypes a reference worker reported (runner.skeleton); ValueError if malformed."""
    if isinstance(value, list):
        return [from_skeleton(item) for item in value]
    if value is None:
        return None
    dtype = getattr(torch, str(value["dtype"]), None)
    shape = value["shape"]
    if not isinstance(dtype, torch.dtype) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"a malformed shape {value!r}"[:200])
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass
class Block:
    """One timed block as the judge saw it: the reported milliseconds of its calls, their length by the judge's
    clock and their wall time (see Judge._command), the sketch of each call's output its reply committed to and
    the reported digest of the outputs (output_digest), and how long drawing the inputs and the digest took by the
    judge's clock."""

    ms: list[float]
    clocked_s: float
    wall_s: float
    sketches: list[str] | None  # on a GPU only
    digest: Any = None
    # The reported digest of the inputs the calls were handed, as the calls left them (under the same seed).
    inputs_digest: Any = None
    # The judge's own copy of the output it will check, read from the stopped worker's memory into the reference
    # timer's `inputs` (CPU: held_memory): the check's number, and how to read it (_copy_held_output). The judge's
    # hash of that call's inputs as the calls left them.
    held_output: dict[str, Any] | None = None
    held_inputs_hash: str | None = None
    drawn_s: float = 0.0
    digest_s: float = 0.0
    # The same steps by the wall clock: on a CPU the judge's clock is CPU time, which a process that exits before
    # the reply takes with it (helpers that compute the block's answers while the inputs are drawn).
    drawn_wall_s: float = 0.0
    digest_wall_s: float = 0.0
    # The worker's word that a call's output shares memory a later call of the block writes again: either side's
    # turns on the copy of every output as its call returns (Judge.copy_outputs), which only costs both sides alike.
    aliased: bool = False

    @property
    def unexplained_s(self) -> float:
        """The judge's clock less what the report explains. On a CPU the reported times are wall time and the clock is
        CPU time, so the report is scaled by the share of the block the job was on a CPU (time waiting for one
        stretches the calls and the work around them alike)."""
        return self.clocked_s * (1 - sum(self.ms) / 1e3 / max(self.wall_s, 1e-9))

    @property
    def unexplained_wall_s(self) -> float:
        """The block's wall time less what the report explains (the judge's clock is this on a GPU)."""
        return self.wall_s - sum(self.ms) / 1e3

    @property
    def per_call_ms(self) -> float:
        return sum(self.ms) / len(self.ms)


class _OutputsReused(Exception):  # noqa: N818 - a signal to run again, not an error
    """A worker said a block's outputs share memory a later call of the block writes again, while outputs were not
    copied (Judge.copy_outputs)."""


class CandidateFailure(Exception):  # noqa: N818 - ends the candidate's run; the verdict comes from what was seen
    """The candidate's worker stopped answering the judge (it died, raised, or its time ran out)."""


class Judge:
    """Runs one candidate against one reference: the sequence of commands and every check on the replies."""

    def __init__(
        self,
        evaluator: Evaluator,
        request: EvaluateRequest,
        device: str,
        seed: int,
        deadline: float,
        reference: ReferenceData,
        static_flags: list[str],
        allow_split: bool,
    ) -> None:
        self.evaluator, self.request, self.device, self.seed = evaluator, request, device, seed
        self.deadline, self.reference = deadline, reference
        # Whether the candidate's extensions may take the split build (build_cache.parse_request).
        self.allow_split = allow_split
        self.run_state = CandidateRun(static_flags=list(static_flags))
        self.pool, self.settings = evaluator.pool, evaluator.settings
        self.gpu = self.pool.placement(device)
        # Every timing command pins the worker to this GPU's timing core (runner.WorkerContext.command).
        cpu = self.pool.timing_cpus.get(self.gpu) if self.gpu is not None else None
        self.pin: dict[str, int] = {"cpu": cpu} if cpu is not None else {}
        self.checks = 0
        # Whether every timed call's output is copied as the call returns, on both sides: where the reference's calls
        # write into memory a later call of the block writes again, its outputs hold a later call's answer by the end
        # of the block, so a check of an earlier call compared that answer on both sides (a red-team candidate that
        # computed only the last call of each block against a reference with an output buffer scored correct at
        # 3.2-3.4x). Turned on by the first block of either side that says so (_block).
        self.copy_outputs = False
        # The last save's nonce and, where the candidate handed its output over in device memory rather than in a
        # file, the description its reply gave (device_handover).
        self.saved: tuple[str, list[Any] | None] = ("", None)
        # Largest file saved for a check: a timed call's outputs are shaped as the correctness trials' are.
        largest = max(output_size_limit(expected, []) for expected in reference.expected)
        self.check_file_limit = min(self.settings.max_file_mb << 20, largest)
        self.builds = 0
        # Seeds of input sets drawn in this evaluation (the correctness sets' too): timed calls never repeat one.
        self.used_seeds = {(seed + 1 + trial) % (1 << 32) for trial in range(self.trials + RECHECK_SETS)}
        # The workers timed against each other: while one runs a block, the other is stopped.
        self.pair: list[Worker] = []
        # Workers the judge keeps stopped between two commands of a timed block (see _command): the pids it
        # stopped and their CPU clocks then, by the worker's pid.
        self.held: dict[int, tuple[list[sandbox.JobStop], dict[int, float]]] = {}
        # Where the candidate's outputs of its last digested block lie (CPU): overwritten before its next block.
        self.used_outputs: list[list[list[int]]] | None = None
        # The reference's timer: taken and sent its job, its model built on the host, ready to time.
        self.launched: Worker | None = None
        self.built = False
        self.timer: Worker | None = None
        # The timer's `ready_to_time` event (the bandwidth its process measured on the GPU).
        self.ready: dict[str, Any] = {}
        self.drawn = reference.data_path == "drawn"
        # Whether every timed set is drawn signed (gpu_checks.make_signed), as the correctness trials that the
        # reference's output allowed were: timed on the unsigned draw alone, a candidate whose answer is right only
        # there (`return x` when every element is non-negative, on a ReLU with KernelBench's `torch.rand` inputs)
        # passes the signed trials by computing and scores on the timed calls by not.
        self.signed_draws = any(reference.signed)
        # Input files the service hands to each worker: none on the `drawn` data path, where workers draw them.
        self.handed_over = range(0) if self.drawn else range(self.trials)
        # Where the reference's timer is kept until the candidate's worker is done (see _launch_timer).
        self.workers = contextlib.AsyncExitStack()

    @property
    def trials(self) -> int:
        return self.request.correctness_trials

    @property
    def max_block_calls(self) -> int:
        """Most calls in a block: a worker holds every input set of a block from the draw and every output until the
        judge has chosen which to check, so together they take at most an eighth of a worker's memory limit (on a
        GPU, of its memory)."""
        call_bytes = max(1, _nbytes(self.reference.expected[0]) + _nbytes(self.reference.inputs[0]))
        budget = (self.settings.memory_limit_mb << 20) // BLOCK_MEMORY_SHARE
        return max(1, min(MAX_BLOCK_CALLS, budget // call_bytes))

    async def run(self) -> CandidateRun:
        async with self._admitted():
            return await self._run()

    async def _run(self) -> CandidateRun:
        state = self.run_state
        asked_at = time.monotonic()
        async with self.pool.worker(self.device, self.gpu) as candidate, self.workers:
            try:
                await asyncio.to_thread(_hand_over, candidate, self.reference, self.handed_over)
            except OSError as error:  # before any of the candidate's code ran in it
                raise EvaluatorFailure(f"the candidate's worker could not be given its inputs: {error}") from error
            job_sent_at = time.monotonic()
            state.phases["startup"] = job_sent_at - asked_at
            await candidate.send(
                {"role": "candidate", "candidate_source": self.request.candidate_source, "seed": self.seed,
                 "trials": self.trials, "reference_source": self.request.reference_source,
                 "max_leaves": self.reference.max_output_leaves, "input_kinds": self.reference.input_kinds}
            )  # fmt: skip
            if self.gpu is not None:
                await self._launch_timer()
            try:
                await self._correctness(candidate, job_sent_at)
                if self._should_time():
                    await self._time_against_reference(candidate)
                await self._release(candidate)  # held since its last reply (a block's digest): it exits now
                await candidate.send({"op": "exit"})
                done = await candidate.expect({"done"}, self.deadline)
                if done is not None:
                    state.replaced |= _names(done.get("replaced"))
            except CandidateFailure:
                # The judge has seen enough (a wrong reply, an error, an exit): end the worker now.
                ended_early = time.monotonic() < self.deadline
            else:
                ended_early = False
            state.outcome = await candidate.finish(time.monotonic() if ended_early else self.deadline)
            if ended_early:
                state.outcome.timed_out = False
            state.events = list(candidate.events)
        return state

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """This evaluation's share of its GPU's memory (device_memory.evaluation_need), held until its workers are
        gone; the wait is not the candidate's time. A problem that cannot fit is the evaluator's failure, with sizes."""
        if self.gpu is None:
            yield
            return
        call_bytes = _nbytes(self.reference.expected[0]) + _nbytes(self.reference.inputs[0])
        # A timed block holds every call's inputs and outputs, and one call's more for what a call makes beyond its
        # output (temporaries) and the re-check's set.
        block_bytes = (self.max_block_calls + 1) * call_bytes
        peak = self.reference.device_peak_bytes
        what = (
            f"an evaluation of this reference (its run peaked at {peak / GIB:.1f} GiB, a timed block holds "
            f"{block_bytes / GIB:.1f} GiB; the larger, in each of two workers, with a CUDA context each)"
        )
        memory = self.pool.device_memory[self.gpu]
        need = evaluation_need(peak, block_bytes)
        try:
            memory.check(need, what)
        except DoesNotFitError as error:
            raise EvaluatorFailure(str(error)) from error
        async with memory.reserve(need, what) as waited:
            self._extend("device_wait", waited)
            yield

    async def _correctness(self, candidate: Worker, job_sent_at: float) -> None:
        state = self.run_state
        event = await self._serve_builds(candidate, {"compiled", "error"})
        state.phases["build"] = time.monotonic() - job_sent_at
        if event is None or event["event"] != "compiled":
            raise CandidateFailure
        state.compiled = True
        if self.drawn:
            await self._drawn_trials(candidate)
            return
        async with self._device():
            run_sent_at = time.monotonic()
            await candidate.send({"op": "run"})
            written = await self._serve_builds(candidate, {"outputs_written", "error"})
            state.phases["correctness"] = time.monotonic() - run_sent_at
        if written is None or written["event"] != "outputs_written":
            raise CandidateFailure
        state.replaced |= _names(written.get("replaced"))
        compare_started = time.monotonic()
        state.comparison = await asyncio.to_thread(
            compare_outputs,
            candidate.root / "home" / "out",
            self.reference.expected[: self.trials],
            self.reference.inputs[: self.trials],
            self.request.atol,
            self.request.rtol,
            self.settings.max_file_mb << 20,
            deadline=self.deadline,
            owner_uid=candidate.uid,
            trusted_root=candidate.root,
        )
        state.phases["compare"] = time.monotonic() - compare_started

    async def _drawn_trials(self, candidate: Worker) -> None:
        """Correctness on the `drawn` data path, trial by trial: the reference's timer draws the trial's inputs from
        its seed and keeps its output on its device; the candidate draws the same inputs where it runs and calls its
        model; the timer checks the output the candidate saves for the trial (_timer_check). The candidate's inputs
        after its call must have the sketch of the timer's untouched inputs. Stops at the first wrong trial, as
        compare_outputs does; no input or expected output passes through the service."""
        state = self.run_state
        errors: list[tuple[float, float]] = []
        mutated = False
        # `compare` is a trial's save, the copy of what it saved, and the timer's check (each a phase of its own).
        phases = dict.fromkeys(
            ("expected", "correctness", "compare", "compare_save", "compare_copy", "compare_handover", "compare_check"),
            0.0,
        )
        try:
            started = time.monotonic()
            await self._timer_built()
            phases["expected"] += time.monotonic() - started
            async with self._device():
                started = time.monotonic()
                timer = await self._start_timer()
                phases["expected"] += time.monotonic() - started
                for trial in range(self.trials):
                    seed, signed = self.seed + 1 + trial, self.reference.signed[trial]
                    command = {"op": "trial", "trial_seed": seed, "signed": signed}
                    started = time.monotonic()
                    expected, _, _ = await self._command(timer, command, "trial")
                    called = time.monotonic()
                    phases["expected"] += called - started
                    nonce = secrets.token_hex(8)
                    await candidate.send({**command, "nonce": nonce, **self.pin})
                    reply = await self._serve_builds(candidate, {"trial", "error"})
                    checked = time.monotonic()
                    phases["correctness"] += checked - called
                    if reply is None or reply["event"] != "trial":
                        raise CandidateFailure
                    if reply.get("nonce") != nonce or not isinstance(reply.get("inputs_sketch"), str):
                        state.flags["result_tampering"] = "a malformed reply to a correctness trial"
                        raise CandidateFailure
                    mutated = mutated or reply["inputs_sketch"] != expected.get("inputs_sketch")
                    try:
                        await self._save(candidate, 0)
                        phases["compare_save"] += time.monotonic() - checked
                        found = await self._timer_check(candidate, 0, commit=False, parts=phases)
                    except _SavedOutputRefusedError as error:
                        found = {"reason": f"unreadable output ({error})"[:500]}
                    phases["compare"] += time.monotonic() - checked
                    if found.get("max_abs") is not None:
                        errors.append((float(found["max_abs"]), float(found.get("max_rel") or 0.0)))
                    if found.get("timed_out") or found.get("reason"):
                        message = TIME_LIMIT_MESSAGE if found.get("timed_out") else f"trial {trial}: {found['reason']}"
                        state.comparison = Comparison(
                            False, message, *error_maxima(errors), input_mutation=mutated,
                            timed_out=bool(found.get("timed_out")),
                        )  # fmt: skip
                        return
        finally:
            state.phases.update(phases)
        state.comparison = Comparison(True, "", *error_maxima(errors), input_mutation=mutated)
        await candidate.send({"op": "trials_done"})
        written = await self._serve_builds(candidate, {"outputs_written", "error"})
        if written is None or written["event"] != "outputs_written":
            raise CandidateFailure
        state.replaced |= _names(written.get("replaced"))

    async def _launch_timer(self) -> Worker:
        """Take the reference's timer, a worker of the reference alone that no candidate can reach, and send it its
        job: it builds the reference's model on the host (seconds for a level-3 model) while the judge goes on. On a
        GPU that is as soon as the candidate's job is sent, so that the two builds overlap; on a CPU when the timer
        is first needed. It lives until the candidate's worker is done."""
        if self.launched is None:
            try:
                timer = await self.workers.enter_async_context(self.pool.worker(self.device, self.gpu))
                await asyncio.to_thread(_hand_over, timer, self.reference, self.handed_over)
            except WorkerStartError as error:
                # In process isolation the candidate's job, running now, can kill a worker as it starts.
                self._timer_lost(f"the reference timer's worker did not start ({error})")
            except OSError as error:
                log.warning("the reference timer could not be set up: %s", error)
                if error.errno not in (errno.ENOSPC, errno.EDQUOT) or self.pool.job_disk_mb is not None:
                    # The timer's failure: a full disk too where each job has a disk of its own, which no other
                    # job can fill. In process isolation the candidate's job, under the service's uid, can change
                    # the directory the timer is given (make it read-only, take it away).
                    self._timer_lost(f"the reference timer could not be set up ({error})")
                # The candidate's job has run, and can fill the filesystem its home shares with the timer's (its
                # directory, its inputs): a full disk counts against it, as in a check's copy (a red-team job that
                # filled it at import and answered wrong got evaluator_error, no penalty).
                self.run_state.flags["result_tampering"] = f"the reference timer could not be set up: {DISK_FULL}"
                raise CandidateFailure from error
            await timer.send({"role": "timer", "reference_source": self.request.reference_source, "seed": self.seed})
            self.launched = timer
        return self.launched

    async def _timer_built(self) -> Worker:
        """The launched timer once its model is built on the host: awaited before the GPU is taken, so that no
        other evaluation waits for it."""
        timer = await self._launch_timer()
        if self.timer is None and not self.built:
            built = await timer.expect({"model_built", "error"}, self.deadline)
            self._timer_answered(built, "the reference timer did not build its model")
            self.built = True
        return timer

    async def _start_timer(self) -> Worker:
        """The timer ready to time: its model moved to the device, with the GPU held (it measures the device's
        bandwidth). On the `drawn` data path before the correctness trials (it keeps their expected outputs), on
        `files` before the timing."""
        if self.timer is not None:
            return self.timer
        timer = await self._timer_built()
        await timer.send({"op": "start"})
        ready = await timer.expect({"ready_to_time", "error"}, self.deadline)
        self._timer_answered(ready, "the reference timer did not start")
        assert ready is not None
        self.timer, self.ready = timer, ready
        return timer

    def _timer_answered(self, event: dict[str, Any] | None, silent: str) -> None:
        """Raise unless the timer's `event` is the one awaited: silence is the candidate's timeout where its time ran
        out (it can make that happen while the timer starts: its import slept up to the deadline); silence otherwise,
        or an error, is _timer_lost."""
        if event is None and time.monotonic() >= self.deadline:
            raise CandidateFailure
        if event is None:
            self._timer_lost(silent)
        if event["event"] == "error":
            self._timer_lost(f"the reference timer failed: {str(event.get('message'))[-2000:]}")

    def _timer_lost(self, what: str) -> NoReturn:
        """The reference's timer failed: it raised, died, or its directory was changed. In strict isolation no job
        can reach it: the evaluator's failure. In process isolation every job runs under the service's uid and can
        signal the timer or write its files: the candidate's (`result_tampering`), so that no candidate chooses
        `evaluator_error` (red-team candidates with wrong answers killed their timer, sent it SIGINT, and planted a
        directory where it writes the reference's source). The price, in that isolation only: a job that breaks
        another evaluation's timer gets that evaluation rejected (docs/evaluator.md, Not covered)."""
        if self.pool.strict:
            raise EvaluatorFailure(f"the reference could not be timed: {what}")
        self.run_state.flags["result_tampering"] = f"{what} (in process isolation any job can reach it)"
        raise CandidateFailure

    def _should_time(self) -> bool:
        state = self.run_state
        hacked = bool(state.replaced) or (state.comparison is not None and state.comparison.input_mutation)
        return (
            state.comparison is not None
            and state.comparison.correct
            and self.request.timing_trials > 0
            and (not hacked)
        )

    async def _serve_builds(self, candidate: Worker, until: set[str]) -> dict[str, Any] | None:
        """Wait for one of `until`, building the extensions the candidate asks for meanwhile."""
        while True:
            event = await candidate.expect({"build_request", *until}, self.deadline)
            if event is None or event["event"] != "build_request":
                return event
            reply = await self._build(event)
            await candidate.send(reply)

    async def _build(self, event: dict[str, Any]) -> dict[str, Any]:
        """Build (or find in the cache) what the candidate asked for; the reply it gets on its channel."""
        self.builds += 1
        if self.builds > build_cache.MAX_BUILDS:
            return {"error": f"more than {build_cache.MAX_BUILDS} extension builds in one evaluation"}
        try:
            kind, arguments = build_cache.parse_request(event, self.device, self.allow_split)
        except build_cache.BuildRequestError as error:
            return {"error": str(error)}
        arch = await asyncio.to_thread(build_cache.service_arch, self.device)
        key = build_cache.cache_key(kind, arguments, arch)
        split_asked = build_cache.SPLIT_ARGUMENT in arguments
        cache_dir = self.settings.cache_dir
        # Off the event loop: in process isolation this hashes the library (up to 64 MiB), a file the job's uid owns.
        path = await asyncio.to_thread(build_cache.cached_library, cache_dir, key, not self.pool.strict)
        if path is not None:
            self.run_state.cache_hits += 1
        else:
            try:
                path, parts = await self.evaluator.shared(
                    f"build:{key}", lambda: self._run_builder(kind, arguments, key, split_asked)
                )
            except build_cache.BuildFailedError as error:
                self.run_state.build_paths.append(error.build_path)
                return {"error": str(error)}
            for part, seconds in parts.items():
                self.run_state.phases[f"build_{part}"] = self.run_state.phases.get(f"build_{part}", 0.0) + seconds
        recorded = await asyncio.to_thread(build_cache.recorded_build_path, cache_dir, key, split_asked)
        self.run_state.build_paths.append(recorded)
        return {"path": str(path), "name": build_cache.library_name(key)}

    async def _run_builder(
        self, kind: str, arguments: dict[str, Any], key: str, split_asked: bool
    ) -> tuple[Path, dict[str, float]]:
        """Compile in a builder worker of its own; the library's path and the parts of the build the builder timed
        (each at most the builder's time by the service's clock). The time spent waiting for a build slot is not
        the candidate's. A build that left no library raises BuildFailedError with the path that decided it."""
        waited = time.monotonic()
        async with self.pool.build_slot():
            self._extend("build_queue", time.monotonic() - waited)
            path = build_cache.cached_library(self.settings.cache_dir, key, verify=not self.pool.strict)
            if path is not None:
                return path, {}
            async with self.pool.worker(self.device, self.gpu) as builder:
                sent_at = time.monotonic()
                await builder.send({"role": "build", "kind": kind, "arguments": arguments, "key": key})
                event = await builder.expect({"built", "error"}, self.deadline)
                builder_s = time.monotonic() - sent_at
                outcome = await builder.finish(self.deadline)
                if event is None or event["event"] != "built":
                    detail = event.get("message", "") if event else f"the build {outcome.describe_exit()}"
                    # A builder that answers has built whole after any split that failed; one that never answered
                    # may have been stopped inside the split.
                    decided = "fallback" if event is not None else "split"
                    raise build_cache.BuildFailedError(
                        str(detail)[-20_000:], build_cache.reported_build_path(decided, split_asked)
                    )
                build_path = build_cache.reported_build_path(event.get("build_path"), split_asked)
                files = event.get("files")
                try:
                    library = await asyncio.to_thread(
                        build_cache.publish,
                        self.settings.cache_dir,
                        builder.root,
                        builder.uid,
                        key,
                        files if isinstance(files, list) else [],
                        build_path,
                        not self.pool.strict,
                    )
                except build_cache.BuildRequestError as error:
                    raise build_cache.BuildFailedError(str(error), build_path) from error
                return library, build_cache.reported_parts(event.get("parts_s"), builder_s)

    def _extend(self, phase: str, seconds: float) -> None:
        """Time the candidate waited for the service (a build slot, the GPU) is added to its deadline."""
        self.deadline += seconds
        self.run_state.phases[phase] = self.run_state.phases.get(phase, 0.0) + seconds

    @contextlib.asynccontextmanager
    async def _device(self) -> AsyncIterator[None]:
        """Hold this evaluation's GPU alone while models run on it (no lock on CPU)."""
        if self.gpu is None:
            yield
            return
        waited = time.monotonic()
        async with self.pool.gpu_locks[self.gpu]:
            self._extend("device_wait", time.monotonic() - waited)
            yield

    async def _time_against_reference(self, candidate: Worker) -> None:
        timing_started = time.monotonic()
        self.run_state.timing_started = True
        await self._timer_built()
        async with self._device():
            timer = await self._start_timer()
            self.pair = [candidate, timer]
            kernels = None
            if self.request.require_custom_kernel:
                kernels = await self._profile(candidate)
                # The profiler leaves instrumentation behind in the process it ran in (CUDA calls outside the timed
                # ones then cost more: an honest Triton candidate was `implausible_timing` in 3 of 6 runs on the
                # H100); the reference is profiled as well, so that both sides carry it.
                await self._profile(timer)
            calls = await self._warm_up(candidate, timer)
            if isinstance(calls, str):
                # Not timed, never unchecked: the set the candidate has not seen is checked as after timing (a
                # red-team candidate right only in its correctness trials was `not_timed` instead of `stale_output`).
                await self._recheck(candidate)
                if "stale_output" not in self.run_state.flags:
                    device = str(self.ready.get("device", ""))
                    self.run_state.timing = TimingResult([], [], 0, {"not_timed": calls}, device)
                await timer.send({"op": "exit"})
                self.run_state.phases["timing"] = time.monotonic() - timing_started
                return
            previous_share, chosen = math.inf, None
            rounds: list[str] = []
            for round_index in range(TIMING_ROUNDS):
                round_started = time.monotonic()
                try:
                    blocks = await self._timed_blocks(candidate, timer, calls)
                except _OutputsReused:  # the round's checks compared answers later calls left: again, with copies
                    blocks = await self._timed_blocks(candidate, timer, calls)
                round_s = time.monotonic() - round_started
                share = room_share(blocks)
                threads = self.settings.threads_per_worker if self.gpu is None else 1
                timing = judge_timing(blocks, self.reference, self.ready, self.request, kernels, share, threads)
                # The draws of both sides by the judge's clock (reference / candidate, ms, medians): what an honest
                # candidate's draws were charged for (their CPU time ran 2.5 times the timer's in a CI run) shows.
                drawn = "/".join(
                    f"{statistics.median(b.drawn_s for b in blocks[side]) * 1e3:.2f}"
                    for side in ("reference", "candidate")
                )
                # The step a flagged round was flagged for (an honest candidate's flagged rounds are read back so).
                implausible = timing.flags.get("implausible_timing", "")
                flagged = f" implausible: {implausible.split(': work moved')[0][:160]}" if implausible else ""
                rounds.append(
                    f"{len(blocks['candidate'])}x{calls} calls {round_s:.1f} s room {share:.2f} drawn {drawn} ms{flagged}"
                )
                if "implausible_timing" not in timing.flags and (chosen is None or share < chosen[0]):
                    # The round the judge's clock resolved best counts: longer blocks can be noisier on a loaded CPU.
                    chosen = (share, timing)
                last = round_index == TIMING_ROUNDS - 1
                if last or "stale_output" in self.run_state.flags:
                    break
                longest = self._longest_block_calls(blocks, calls)
                # On a CPU, where the clock could not check the report at all (a room beyond the candidate's whole
                # time), the next blocks are the longest allowed, whatever this round's room: a 10x faster candidate
                # on a 2-core machine had rooms from 0.4 to 3900 in blocks 10 to 16 times longer than the first,
                # and from 0.24 to 1.0 in the longest (the room is a noisy estimate well above 1).
                unresolved_cpu = self.gpu is None and share >= 1
                growth = min(16.0, share / MAX_ROOM_SHARE * 1.5)
                grown = longest if unresolved_cpu else min(longest, math.ceil(calls * growth))
                # A longer round that would not end before the deadline (with the same again to spare for the
                # recheck and the reply) is not started: the judge's wish for a clearer clock must not turn an
                # honest candidate on a loaded machine into a timeout.
                next_round_s = round_s * self._block_count(grown) * grown / (self._block_count(calls) * calls)
                fits = time.monotonic() + next_round_s + round_s * (ROUND_MARGIN - 1) < self.deadline
                # The room is mostly the judge's own noise, which longer blocks do not lengthen: where even the
                # longest blocks allowed would leave it well beyond the candidate's time (1.5 times: the estimate is
                # rough), they would credit no more speed than this round does (unverified_timing either way), and
                # a round is not spent on them. On a GPU host under load, second rounds went from a room of 6.45 to
                # 5.55 and from 3695 to 54 this way.
                can_resolve = share * calls / grown < 1.5
                helps = share < previous_share * 2 / 3 and can_resolve
                if share > MAX_ROOM_SHARE and calls < grown and fits and (helps or unresolved_cpu):
                    # The judge's clock cannot yet tell the candidate's blocks from its own noise: longer blocks,
                    # as long as they help (noise that grows with the block, a loaded CPU's, does not shrink).
                    calls = grown
                elif "implausible_timing" not in timing.flags:
                    # A burst of load can hit most blocks of one round; a false report is seen in every round.
                    break
                previous_share = share
            # Where a timing's time went: its rounds, the blocks and calls of each, and how well the clock resolved it.
            log.info("timing rounds: %s", "; ".join(rounds))
            await self._recheck(candidate)
            await timer.send({"op": "exit"})
        self.run_state.phases["timing"] = time.monotonic() - timing_started
        self.run_state.timing = chosen[1] if chosen is not None else timing

    async def _warm_up(self, candidate: Worker, timer: Worker) -> int | str:
        """Warm both up, in blocks of at most max_block_calls calls (a block holds every input set and output of
        its calls: five warm-up calls of KernelBench's 19_ReLU in one block took 60 GiB of the H100 in the timer);
        the calls per block that make the reference's block last `min_sample_ms`.

        The reference warms up first, and its pace decides whether timing can end before the deadline at all: where
        it could not, even with the candidate as fast as the reference, the time limit is too short for this
        reference on this machine (KernelBench's level 2 at its published sizes on a 2-core CPU: honest copies of
        the reference ended `timeout`), which is not the candidate's doing, and why timing was not done is returned
        instead (`not_timed`). Nothing the candidate controls may earn it that (a red team turned `timeout` and
        `stale_output` into `not_timed` three ways before these rules):
        - the time the candidate itself spent before timing (importing, building, its trials and saves) beyond its
          trials at the reference's pace is given back to the time left, so that dawdling leaves no less time;
        - the reference's pace is read on the judge's clock (on a CPU its CPU time, which a process that stops the
          timer does not lengthen);
        - the warm-up blocks' outputs are checked by digest as timed blocks are (a fast wrong warm-up is
          `stale_output`), and a candidate slower than the reference in its warm-up by the wall clock is timed all
          the same and may reach the limit: that is its doing."""
        # At least two calls, in one block where they fit: an output the candidate returns again (a constant it keeps)
        # shows as shared memory there, and copies go on before the judge overwrites any output it used
        # (_poison_outputs), which would overwrite the constant itself.
        warmup_calls = max(2, self.request.warmup_trials)
        chunks = [
            self._fresh_seeds(min(self.max_block_calls, warmup_calls - start))
            for start in range(0, warmup_calls, self.max_block_calls)
        ]
        digest_seeds = [secrets.randbits(62) for _ in chunks]
        reference = []
        for seeds, seed in zip(chunks, digest_seeds, strict=True):
            try:
                reference.append(await self._block(timer, seeds, digest_seed=seed))
            except _OutputsReused:  # again, each output copied: the candidate's warm-up is held to these digests
                reference.append(await self._block(timer, seeds, digest_seed=seed))
        reference_ms = [ms for block in reference for ms in block.ms]
        # Both sides run blocks of the same calls, sized from the reference's (trusted) time, so the time the
        # judge sees beyond the reported times has the same parts on both sides (the pipe, the inputs' checks).
        per_call_ms = max(1e-4, min(reference_ms))  # the first calls are cold
        min_sample_ms = self.settings.min_sample_ms or (
            MIN_SAMPLE_MS_GPU if self.gpu is not None else MIN_SAMPLE_MS_CPU
        )
        calls = max(1, min(self.max_block_calls, math.ceil(min_sample_ms / per_call_ms)))
        # The reference's pace, a call with its drawing, by the judge's clock.
        warmup_s = sum(b.drawn_s + b.clocked_s for b in reference)
        call_s = warmup_s / warmup_calls
        round_s = 2 * self._block_count(calls) * calls * call_s
        phases = self.run_state.phases
        spent_s = sum(phases.get(name, 0.0) for name in ("build", "correctness", "compare_save"))
        # The service's own waits (a build slot) already moved the deadline.
        spent_s -= phases.get("build_queue", 0.0)
        given_back_s = max(0.0, spent_s - self.trials * call_s)

        def not_timed(needed_s: float, what: str) -> str | None:
            left_s = self.deadline - time.monotonic() + given_back_s
            if needed_s <= left_s:
                return None
            return (
                f"not timed: at the reference's own pace ({call_s * 1e3:.1f} ms a call with its drawing), {what} "
                f"needs about {needed_s:.0f} s with its margin, and {left_s:.0f} s of the time limit were left: "
                "raise `timeout_s` or lower `timing_trials` (the outputs were checked and are correct; there is no "
                "speedup)"
            )

        rounds = f"a timing round ({self._block_count(calls)} blocks of {calls} calls on each side)"
        why = not_timed(ROUND_MARGIN * (warmup_s + round_s), f"the candidate's warm-up and {rounds}")
        if why:
            return why
        warmed = []
        for seeds, seed in zip(chunks, digest_seeds, strict=True):
            try:
                warmed.append(await self._block(candidate, seeds, digest_seed=seed))
            except _OutputsReused:  # copies change none of the reference's outputs, which are each their call's
                warmed.append(await self._block(candidate, seeds, digest_seed=seed))
        for index, (theirs, ours) in enumerate(zip(reference, warmed, strict=True)):
            if self._stale(theirs, ours, f"warm-up block {index}"):
                raise CandidateFailure
        reference_wall_s = sum(b.drawn_wall_s + b.wall_s for b in reference)
        pace = sum(b.drawn_wall_s + b.wall_s for b in warmed) / max(reference_wall_s, 1e-9)
        if pace <= ROUND_MARGIN:
            # A faster candidate's own pace counts (it shortens the round); a slower one's, up to the margin, is
            # taken as the reference's.
            round_s = self._block_count(calls) * calls * call_s * (1 + min(1.0, pace))
            why = not_timed(ROUND_MARGIN * round_s, rounds)
            if why:
                return why
        return calls

    def _longest_block_calls(self, blocks: dict[str, list[Block]], calls: int) -> int:
        """Most calls a block may grow to: within max_block_calls, and lasting at most MAX_BLOCK_S on either side
        by this round's blocks, drawing its inputs and the digest included (on a CPU, drawing a call's inputs can
        take ten times the call)."""
        longest = max(
            statistics.median(b.drawn_wall_s + b.wall_s + b.digest_wall_s for b in side)
            for side in blocks.values()
            if side
        )
        return max(calls, min(self.max_block_calls, math.floor(calls * MAX_BLOCK_S / max(longest, 1e-6))))

    def _block_count(self, calls: int) -> int:
        """Blocks of a round with `calls` calls each: `timing_trials` calls a side at least, in at least
        MIN_TIMED_BLOCKS blocks, and never more blocks than `timing_trials`. Longer blocks mean fewer of them, so a
        round that grows its blocks for a clearer clock costs about the same time, not up to 16 times more."""
        trials = self.request.timing_trials
        return min(trials, max(MIN_TIMED_BLOCKS, math.ceil(trials / calls)))

    def _fresh_seeds(self, count: int) -> list[int]:
        """Seeds of input sets no worker has seen, each call of a timed block draws its inputs from one. 32 bits
        (torch's CPU generator uses no more of a seed), random, and never one used before in this evaluation."""
        seeds: list[int] = []
        while len(seeds) < count:
            seed = secrets.randbits(32)
            if seed not in self.used_seeds:
                self.used_seeds.add(seed)
                seeds.append(seed)
        return seeds

    async def _timed_blocks(self, candidate: Worker, timer: Worker, calls: int) -> dict[str, list[Block]]:
        """`_block_count(calls)` blocks of `calls` calls on each side, alternating which goes first, every call on
        fresh inputs drawn from a seed sent with the block. Each candidate block's digest is checked against the
        reference's, and after each block one call's whole output, chosen before it and told to no worker."""
        blocks: dict[str, list[Block]] = {"reference": [], "candidate": []}
        count = self._block_count(calls)
        for index in range(count):
            seeds, digest_seed = self._fresh_seeds(calls), secrets.randbits(62)
            # Chosen now, told to no worker: the call of this block checked in full. Every block has one: the speedup
            # is a median of blocks, so a candidate that skipped work in just over half of them, where a quarter
            # were checked, set the median unchecked often enough to win on average (a red-team candidate
            # computing part of each output and answering the digest's positions in a mode: `correct` at 15-40x in
            # 1-2 of 6-8 evaluations at 5 timing trials, rejected otherwise).
            check_call = secrets.randbelow(calls)
            order = ("reference", "candidate") if index % 2 == 0 else ("candidate", "reference")
            for role in order:
                if role == "reference":
                    blocks[role].append(await self._block(timer, seeds, digest_seed=digest_seed))
                else:
                    blocks[role].append(
                        await self._block(candidate, seeds, digest_seed=digest_seed, check_call=check_call)
                    )
            if self._stale(blocks["reference"][-1], blocks["candidate"][-1], f"timed block {index}"):
                break
            if self.gpu is None:
                blocks["reference"][-1].held_inputs_hash = await self._timers_inputs_hash(timer, check_call)
            if self._inputs_written(blocks["reference"][-1], blocks["candidate"][-1], index, check_call):
                break
            if not await self._check(candidate, check_call, blocks["candidate"][-1]):
                self.run_state.flags.setdefault(
                    "stale_output",
                    f"the output of timed call {check_call} of block {index} was wrong (an answer cached or computed "
                    "before its inputs changed)",
                )
                break
        return blocks

    def _stale(self, reference: Block, candidate: Block, which: str) -> bool:
        """Whether the candidate's block digest cannot come from outputs within tolerance of the reference's on the
        same fresh inputs; flags `stale_output` if so."""
        wrong = output_digest.mismatch(
            reference.digest, candidate.digest, len(candidate.ms), self.request.atol, self.request.rtol
        )
        if wrong:
            self.run_state.flags["stale_output"] = (
                f"the outputs of {which} were wrong on its fresh inputs ({wrong}): an answer cached, computed before "
                "its inputs changed, or not computed"
            )
        return bool(wrong)

    def _inputs_written(self, reference: Block, candidate: Block, index: int, check_call: int) -> bool:
        """Whether the candidate's calls in block `index` changed the inputs they were handed, as its digest of them
        after the calls says against the reference's, or (CPU) the inputs of `check_call` read from its memory against
        the timer's hash of its own (unless the reference writes its own inputs); flags `input_mutation` if so. Correctness trials check each call's inputs in full, but a candidate can tell a timed call from a
        trial (by the stack): a red-team candidate wrote its answer into its first input in timed calls only, for an
        add one memory stream fewer than a fresh output's (`correct` at 1.26-1.43x with no flag). The digest is the
        worker's word, and reads sampled positions; on a CPU the judge also reads one call's inputs from the stopped
        worker's memory (`_block`), as it reads its output, which holds the block to untouched bytes: keeping them
        would take a copy of every set before the calls, a stream more than the one saved."""
        if self.reference.writes_inputs:
            return False
        wrong = output_digest.mismatch(
            reference.inputs_digest, candidate.inputs_digest, len(candidate.ms), None, None, inputs=True
        )
        if wrong:
            self.run_state.flags["input_mutation"] = f"the calls of timed block {index} changed their inputs ({wrong})"
            return True
        held = reference.held_inputs_hash, candidate.held_inputs_hash
        if None not in held and held[0] != held[1]:
            self.run_state.flags["input_mutation"] = (
                f"the inputs of timed call {check_call} of block {index}, read from the worker's memory after the "
                "block, are not the ones drawn for it: the calls changed their inputs"
            )
            return True
        return False

    async def _block(
        self,
        worker: Worker,
        seeds: list[int],
        digest_seed: int | None = None,
        one_set: dict[str, Any] | None = None,
        check_call: int | None = None,
    ) -> Block:
        """One block, each step timed by the judge with the other worker stopped (from the first step to the last, so
        one scan stops it): draw the inputs from `seeds` (or take the one set `one_set` names, the re-check's), a timed call on each, then
        the digest of the outputs under `digest_seed`. On a CPU the output of `check_call` is read from the worker's
        memory while its job is stopped after the block (held_memory), before anything of it runs again, and with it
        the inputs of that call, which the reference's timer keeps to hash once both sides' blocks are done
        (_timers_inputs_hash)."""
        async with self._paused(worker):
            if self.used_outputs is not None and worker is not self.timer:
                await self._poison_outputs(worker, self.used_outputs)
            drawn_s = drawn_wall_s = 0.0
            if one_set is None:
                command: dict[str, Any] = {"op": "draw", "seeds": seeds, "signed": self.signed_draws}
                _, drawn_s, drawn_wall_s = await self._command(worker, command, "drawn", clocked=True, hold=True)
            command = {"op": "block", **(one_set or {}), "copy": self.copy_outputs}
            hold = digest_seed is not None or check_call is not None
            reply, clocked_s, wall_s = await self._command(worker, command, "block", clocked=True, hold=hold)
            ms = reply.get("ms")
            calls = len(seeds) + (one_set is not None)
            if not (
                isinstance(ms, list)
                and len(ms) == calls
                and all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in ms)
            ):
                self.run_state.flags["result_tampering"] = "a malformed timing reply"
                raise CandidateFailure
            sketches = reply.get("sketches") if self.gpu is not None else None
            if self.gpu is not None and not output_digest.valid_sketches(sketches, calls):
                self.run_state.flags["result_tampering"] = "a timing reply without a sketch of each call's output"
                raise CandidateFailure
            block = Block(
                [float(v) for v in ms],
                clocked_s,
                wall_s,
                sketches,
                drawn_s=drawn_s,
                drawn_wall_s=drawn_wall_s,
                aliased=reply.get("aliased") is True,
            )
            if block.aliased and not self.copy_outputs and one_set is None:
                # The block's outputs are not each its call's: copies from now on, on both sides, and this block, or
                # the round it is part of, again (a reference that writes a ring of kept buffers shows it only once a
                # block holds more calls than the ring). Either side's word turns them on: copies cost both sides
                # alike, and a candidate that keeps its output buffer (an honest optimisation) was stale_output
                # against a reference that returns fresh tensors, every call's output holding the last answer.
                self.copy_outputs = True
                log.info("a side's outputs share memory a later call writes again: each output is copied")
                raise _OutputsReused
            reply_regions = reply.get("regions")
            if check_call is not None and self.gpu is None:
                block.held_output = await self._copy_held_output(
                    worker, reply_regions, reply.get("strides"), calls, check_call
                )
                if one_set is None:
                    block.held_inputs_hash = await self._read_held(
                        worker, reply.get("input_regions"), calls, check_call, "inputs", held_memory.read_hash
                    )
            if digest_seed is not None:
                # On a CPU the timer keeps the block's inputs (to the next draw, or _timers_inputs_hash, asked only
                # once both sides' blocks are done: nothing it does before the candidate's turn depends on the check).
                keep_inputs = self.gpu is None and worker is self.timer
                command = {"op": "digest", "seed": digest_seed, "keep_inputs": keep_inputs}
                # On a CPU the candidate stays stopped from its digest's reply to its next block's draw: see _check.
                hold = self.gpu is None and worker is not self.timer
                reply, block.digest_s, block.digest_wall_s = await self._command(
                    worker, command, "digested", clocked=True, hold=hold
                )
                block.digest, block.inputs_digest = reply.get("digest"), reply.get("inputs_digest")
                if worker is not self.timer:
                    self.run_state.replaced |= _names(reply.get("replaced"))
                if not (output_digest.valid(block.digest) and output_digest.valid(block.inputs_digest)):
                    self.run_state.flags["result_tampering"] = "a malformed digest"
                    raise CandidateFailure
                if self.gpu is None and worker is not self.timer:
                    if not held_memory.valid_regions(reply_regions, calls):
                        self.run_state.flags["result_tampering"] = (
                            "a timing reply without the place of each call's output"
                        )
                        raise CandidateFailure
                    self.used_outputs = reply_regions
            return block

    async def _timers_inputs_hash(self, timer: Worker, call: int) -> str:
        """The timer's own hash of its inputs of `call` in the block both sides have just run, off the clock and only
        once the candidate's block is done, so nothing the timer does before it tells whether the block is checked.
        The timer is a process the candidate cannot reach, so its word stands (in process isolation the judge may not
        read its memory)."""
        reply, _, _ = await self._command(timer, {"op": "inputs_hash", "call": call}, "inputs_hashed")
        held = reply.get("hash")
        if not isinstance(held, str):
            self._timer_lost("its reply carried no hash of a call's inputs")
        return held

    async def _read_held(
        self,
        worker: Worker,
        regions: Any,
        calls: int,
        call: int,
        what: str,
        read: Callable[[int, Any, int, bool], _Found],
    ) -> _Found | None:
        """`read(pid, regions of call, max_bytes, readable)` of one call's output or inputs (`what`) in the stopped
        candidate worker's memory where its reply put them (None where the job's processes are gone). A job that made
        itself undumpable, or put them where nothing can be read, is result_tampering; a service that may not read
        the memory is evaluator_error (an unbound check would let a forged output through)."""
        if not held_memory.valid_regions(regions, calls):
            self.run_state.flags["result_tampering"] = f"a timing reply without the place of each call's {what}"
            raise CandidateFailure
        largest = max(map(_nbytes, self.reference.inputs)) if what == "inputs" else _nbytes(self.reference.expected[0])
        max_bytes = 2 * largest + 4096
        try:
            pid = held_memory.worker_pid(worker.proc.pid, strict=worker.uid is not None)
            found = await asyncio.to_thread(read, pid, regions[call], max_bytes, self.pool.memory_readable)
            aliased = await asyncio.to_thread(held_memory.aliased_pages, pid)
        except held_memory.UnreadableMemory as error:
            self.run_state.flags["result_tampering"] = f"the {what} of timed call {call} could not be read: {error}"
            raise CandidateFailure from error
        except PermissionError as error:
            # The service could not read a worker's memory at start-up either: not the job's doing. A check the
            # judge cannot hold to the timed call would let a forged output through, so none is made.
            raise _memory_out_of_reach(error, "read") from error
        except OSError:
            return None  # the job's processes are gone: its next command fails
        if aliased:
            # Memory the worker maps many times over (held_memory.aliased_pages): a red-team candidate's did so to
            # make the input buffers' refills (since removed) cheaper than the reference timer's.
            self.run_state.flags["result_tampering"] = (
                f"the worker mapped the same shared pages writable at more than one address: {aliased[0][:300]}"
            )
            raise CandidateFailure
        return found

    async def _copy_held_output(
        self, worker: Worker, regions: Any, strides: Any, calls: int, call: int
    ) -> dict[str, Any] | None:
        """Copy the output of `call` from the stopped candidate worker's memory into the reference timer's `inputs`
        as the next check's (_copy_to_timer), before anything of the job runs again: what the timer then compares
        (_check) is what the timed call left there, and nothing of the candidate runs for the check. Before, the
        candidate saved the output itself, held to a hash the judge read; the save ran on the candidate's time, and a
        red-team-style candidate prepared the next block's outputs meanwhile (a 64 MiB diag_embed zero-filled, its
        diagonal then written in the timed calls: `correct` at 7.4x, and at 2.3x on CI's machine once the save was
        clocked against the timer's). How to read the copy (the check's number, each tensor's size and strides), or
        None where the job's processes are gone."""
        if not (
            held_memory.valid_regions(regions, calls)
            and isinstance(strides, list)
            and len(strides) == calls
            and isinstance(strides[call], list)
            and len(strides[call]) == len(regions[call])
            and all(isinstance(s, list) and all(type(n) is int for n in s) for s in strides[call])
        ):
            self.run_state.flags["result_tampering"] = "a timing reply without the place and layout of each output"
            raise CandidateFailure
        assert self.timer is not None
        self.checks += 1
        timer, check = self.timer, self.checks

        def copy(pid: int, call_regions: list[list[int]], max_bytes: int, readable: bool) -> bool:
            _copy_to_timer(
                timer,
                check,
                max_bytes,
                lambda write: held_memory.copy_out(pid, call_regions, max_bytes, readable, write),
            )
            return True

        try:
            copied = await self._read_held(worker, regions, calls, call, "output", copy)
        except _SavedOutputRefusedError as error:  # only a full disk (_copy_to_timer)
            self.run_state.flags["stale_output"] = f"the output of timed call {call} could not be checked: {error}"
            raise CandidateFailure from error
        if copied is None:
            return None
        return {"check": check, "sizes": [size for _, size in regions[call]], "strides": strides[call]}

    async def _poison_outputs(self, worker: Worker, regions: list[list[list[int]]]) -> None:
        """Overwrite the candidate's outputs of its last digested block in its memory (held_memory.poison), the
        checked call's too, before its next block: the runner holds them until that block's first command, so the
        memory is still theirs. As a caller that reuses what it was handed may: a red-team candidate kept the buffers
        it had returned (a 16 MiB diag_embed output, zeros but its diagonal), took them again in later blocks and
        wrote only the diagonal, `correct` at 10.6-14.3x where the reference allocates and zeroes each output; and
        while the checked call's output was spared, one whose blocks held one call each kept them all (8.5x). A
        region the reply gave falsely spares a real buffer only where its call is never the checked one (the check
        reads the checked call's region)."""
        self.used_outputs = None
        max_bytes = len(regions) * (2 * _nbytes(self.reference.expected[0]) + 4096)
        readable = self.pool.memory_readable
        try:
            pid = held_memory.worker_pid(worker.proc.pid, strict=worker.uid is not None)
            await asyncio.to_thread(held_memory.poison, pid, [r for call in regions for r in call], max_bytes, readable)
        except held_memory.UnreadableMemory as error:
            self.run_state.flags["result_tampering"] = f"the block's outputs could not be overwritten: {error}"
            raise CandidateFailure from error
        except PermissionError as error:
            raise _memory_out_of_reach(error, "write") from error
        except OSError:
            return  # the job's processes are gone: its next command fails

    async def _command(
        self, worker: Worker, command: dict[str, Any], reply: str, clocked: bool = False, hold: bool = False
    ) -> tuple[dict[str, Any], float, float]:
        """Send one timing command (the other worker of the pair is stopped: see _block); the reply carrying its
        nonce, how long the job took for it by the judge's clock (`clocked`), and the wall time.

        On a GPU the clock is the wall time until the reply. On a CPU it is the CPU time every process of the job
        used meanwhile, per torch thread: the machine's load does not move it, so the work around the calls
        (drawing inputs, the digest) costs both sides the same, and a report can claim no less time than the CPU
        work it did. Where the job has no cgroup, a process of it that exits meanwhile takes the time it used since
        with it (_jobs_clocks).

        `hold`: the worker's job stays stopped from its reply until the judge sends it the next command, so nothing
        it does between two commands of a block (computing the block's answers from the inputs it has just drawn)
        escapes the clock: what it does before it is stopped counts in this command's time, the rest in the next."""
        nonce = secrets.token_hex(8)
        on_cpu = clocked and self.gpu is None
        held = await self._release(worker)
        cpu_before: dict[int, float] = {}
        if on_cpu:
            # A held job ran nothing since it was stopped (no new process either; _release checked): its known
            # pids' clocks are exact.
            cpu_before = held if held is not None else await asyncio.to_thread(_job_cpu_clocks, worker)
        sent_at = time.monotonic()
        await worker.send({**command, "nonce": nonce, **self.pin})
        event = await worker.expect({reply, "error"}, self.deadline)
        wall_s = clocked_s = time.monotonic() - sent_at
        if hold and event is not None and event["event"] == reply:
            # One scan of the job's processes both stops them and reads their clocks.
            stops, cpu_after = await asyncio.to_thread(_stop_and_clock, worker)
            self.held[worker.proc.pid] = (stops, cpu_after)
        elif on_cpu:
            cpu_after = await asyncio.to_thread(_job_cpu_clocks, worker)
        if on_cpu:
            clocked_s = _cpu_used_s(cpu_before, cpu_after) / self.settings.threads_per_worker
        if event is None and time.monotonic() >= self.deadline:
            raise CandidateFailure  # the evaluation's time ran out (the verdict says so), whoever was running
        if worker is self.timer:
            self._timer_answered(event, "the reference timer stopped answering")
        if event is None or event["event"] == "error":
            raise CandidateFailure
        if event.get("nonce") != nonce:
            self.run_state.flags["result_tampering"] = "a timing reply the judge did not ask for"
            raise CandidateFailure
        return event, clocked_s, wall_s

    @contextlib.asynccontextmanager
    async def _paused(self, active: Worker) -> AsyncIterator[None]:
        """Stop every process of the other worker's job (SIGSTOP: its process group, its process tree, in strict
        isolation its uid) while `active` runs, so a candidate's threads, children or daemons cannot slow the
        reference down while it is timed. A worker the judge holds stopped since its last reply is left to that hold,
        which its next command checks (_release): stopped and resumed here, it ran while held (an honest candidate
        whose outputs first shared memory in a timed block, so that the round began again with the reference's
        block, was `result_tampering` so)."""
        others = [w for w in self.pair if w is not active and w.proc.returncode is None and w.proc.pid not in self.held]
        stops, at_stop = await asyncio.to_thread(_stop_and_clock, *others) if others else ([], {})
        try:
            yield
        finally:
            if stops:
                await self._resume_checked(others, stops, at_stop, check=self.timer not in others)

    async def _release(self, worker: Worker) -> dict[int, float] | None:
        """Resume a worker the judge held stopped after its last reply (None if it did not): the CPU clocks of its
        processes just before, checked against those read when it was stopped."""
        held = self.held.pop(worker.proc.pid, None)
        if held is None:
            return None
        stops, at_stop = held
        return await self._resume_checked([worker], stops, at_stop)

    async def _resume_checked(
        self, workers: list[Worker], stops: list[sandbox.JobStop], at_stop: dict[int, float], check: bool = True
    ) -> dict[int, float]:
        """Resume what _stop_and_clock stopped; the CPU clocks of its processes just before, checked (`check`)
        against those read at the stop (_check_stayed_stopped)."""
        pids = [pid for stop in stops for pid in stop.pids]
        now, ran = await asyncio.to_thread(_read_since_stops, workers, stops, pids, check)
        await asyncio.to_thread(_resume, workers, pids)
        if check:
            self._check_stayed_stopped(workers, at_stop, now, ran)
        return now

    def _check_stayed_stopped(
        self, workers: list[Worker], at_stop: dict[int, float], now: dict[int, float], ran: str
    ) -> None:
        """A stopped job's processes neither run nor use CPU. Something the job armed before the stop could resume it
        without any of its processes running then (a timer that sends SIGCONT, which syscall_filter now refuses; an
        exit that orphans a stopped process group): it would then run beside the other side's block, or after the
        judge read its clock. `ran`: what the job's threads show (sandbox.ran_since_stop), which tells even a run
        too short for the clocks, or one whose process exited with its clock, or started one the stop never saw (a
        red-team job, resumed by its own timer, spawned a process and exited: correct at 1.04x). Not where the
        service killed the job meanwhile (its next command fails, and its verdict says why)."""
        ran_s = max((now.get(pid, seconds) - seconds for pid, seconds in at_stop.items()), default=0.0)
        if ran_s > RAN_WHILE_STOPPED_S:
            self.run_state.flags["result_tampering"] = (
                f"a process of the job ran while the judge held it stopped ({ran_s * 1e3:.1f} ms of CPU)"
            )
        elif ran and not any(worker.killed_for for worker in workers):
            self.run_state.flags["result_tampering"] = f"the job ran while the judge held it stopped: {ran}"

    async def _check(self, candidate: Worker, call: int, block: Block) -> bool:
        """Have the reference's timer compare the candidate's output of one call of its last `block` with its own
        output of the same call (_timer_check). On a CPU the output is the judge's copy of the bytes the timed call
        left in the worker's memory (_copy_held_output), and the candidate stays stopped from its digest's reply to
        its next block: nothing it does runs while its block is checked. On a GPU the candidate saves the output, held
        to the sketch its block's reply committed to: one saved with another was filled in or computed again after
        the block."""
        if self.gpu is None:
            if block.held_output is None:
                # The judge copied nothing of this call's output from memory (_read_held: its process seemed gone),
                # yet the job answers: nothing holds a check to the timed call (a worker whose main thread had
                # exited, its others serving the judge, scored correct at 11-15x with a forged save).
                self.run_state.flags["result_tampering"] = (
                    f"the output of timed call {call} could not be read from the worker's memory after the block, yet "
                    "the job went on answering"
                )
                raise CandidateFailure
            found = await self._timer_check(candidate, call, copied=block.held_output)
        else:
            assert block.sketches is not None
            await self._save(candidate, call)
            try:
                found = await self._timer_check(candidate, call)
            except _SavedOutputRefusedError as error:
                if error.disk_full:
                    self.run_state.flags["stale_output"] = (
                        f"the output of timed call {call} could not be checked: {DISK_FULL}"
                    )
                return False
            if found.get("commitment") != block.sketches[call]:
                self.run_state.flags["result_tampering"] = (
                    f"the output saved for the check of call {call} is not the one its timed call produced (not the "
                    "sketch the block's reply committed to: filled in or computed again after it)"
                )
                raise CandidateFailure
        if found.get("timed_out"):
            raise CandidateFailure
        return not found.get("reason")

    async def _save(self, candidate: Worker, call: int) -> None:
        """Have the candidate save the output of `call` of its last block (or of its last correctness trial) as the
        next check, `checks/<self.checks>/0.pt`."""
        self.checks += 1
        command = {"op": "save", "call": call, "check": self.checks, "max_leaves": self.reference.max_output_leaves}
        reply, _, _ = await self._command(candidate, command, "saved")
        self.run_state.replaced |= _names(reply.get("replaced"))
        handover = reply.get("handover")
        self.saved = (reply["nonce"], handover if isinstance(handover, list) else None)

    async def _timer_check(
        self,
        candidate: Worker,
        call: int,
        commit: bool = True,
        parts: dict[str, float] | None = None,
        copied: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The reference's timer's check (runner.check_saved_output: on its device, where its own output is) of the
        candidate's output against the timer's output of `call`: the output the candidate saved last (_save), or the
        judge's `copied` one (_copy_held_output). The reason it is wrong, the largest errors, whether the check ran
        out of time, and (`commit`, GPU) the sketch of the output compared. _SavedOutputRefusedError where the saved
        file is not a single regular file of the job's within the size of an output, or could not be copied.
        `parts`: where the seconds of the copy and of the check are added."""
        assert self.timer is not None
        started = time.monotonic()
        # The judge's copy is in the timer's `inputs` already.
        nonce, described = self.saved if copied is None else ("", None)
        try:
            if described is not None:
                # Handed over in device memory: the descriptors go on to the timer, which copies what they map.
                await asyncio.to_thread(_pass_handover, candidate, self.timer, self.checks, nonce, described)
            elif copied is None:
                # The saved file goes to the timer as a copy in a directory only the service writes: the job owns
                # its `checks` directory and could change its file while the timer reads it.
                await asyncio.to_thread(_hand_over_check, candidate, self.timer, self.checks, self.check_file_limit)
        except _TimerSocketError as error:
            self._timer_lost(f"the reference timer's handover socket failed ({error})")
        except (OSError, ValueError, device_handover.HandoverError) as error:
            disk_full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
            # A full disk counts against the candidate even where the timer's disk is its own: the candidate sets
            # the size of what is copied, up to the copy limit (a red-team job padded its file, sparse on its own
            # disk, to have the copy fail and get evaluator_error).
            log.log(logging.WARNING if disk_full else logging.INFO, "check %d: refused: %s", self.checks, error)
            raise _SavedOutputRefusedError(DISK_FULL if disk_full else str(error), disk_full) from error
        check = copied["check"] if copied is not None else self.checks
        command = {
            "op": "check", "call": call, "check": check, "atol": self.request.atol, "rtol": self.request.rtol,
            "seconds": max(0.0, self.deadline - time.monotonic()), "commit": commit, "handover": described is not None,
            "copied": copied,
        }  # fmt: skip
        copy_done = time.monotonic()
        try:
            found, _, _ = await self._command(self.timer, command, "checked")
        finally:
            try:
                if described is None:
                    name = f"check_{check}.raw" if copied is not None else f"check_{check}.pt"
                    await asyncio.to_thread(_remove_check, self.timer, name)
            except OSError as error:
                self._timer_lost(f"the reference timer's inputs directory was changed ({error})")
        if parts is not None:
            copy = "compare_handover" if described is not None else "compare_copy"
            parts[copy] = parts.get(copy, 0.0) + copy_done - started
            parts["compare_check"] = parts.get("compare_check", 0.0) + time.monotonic() - copy_done
        return found

    async def _recheck(self, candidate: Worker) -> None:
        """After timing: one more timed call, on the set the candidate never saw."""
        if "stale_output" in self.run_state.flags:
            return
        assert self.timer is not None
        recheck = self.trials  # the reference's extra set
        if self.drawn:
            # A seed the candidate cannot know (the trials' follow from the request's seed), drawn as the reference's
            # extra set was: signed where that set is.
            seed = self._fresh_seeds(1)[0]
            one_set: dict[str, Any] = {"trial_seed": seed, "signed": self.reference.signed[recheck]}
        else:
            one_set = {"set": recheck}
            for worker in (self.timer, candidate):
                failure = await asyncio.to_thread(_hand_over_one, worker, self.reference, recheck)
                if failure == DISK_FULL and worker is self.timer and self.pool.job_disk_mb is not None:
                    self._timer_lost(
                        f"the re-check's inputs do not fit the timer's disk of {self.pool.job_disk_mb} MiB"
                    )
                if failure == DISK_FULL:
                    log.warning("the re-check's inputs could not be written: %s", failure)
                    self.run_state.flags["stale_output"] = f"the re-check could not be run: {failure}"
                    return
                if failure and worker is self.timer:
                    self._timer_lost(f"the reference timer's inputs could not be handed over: {failure}")
                if failure:
                    self.run_state.flags["result_tampering"] = (
                        "the job replaced the inputs directory the service gave it"
                    )
                    raise CandidateFailure
        # The timer's output on the set is what the candidate's is checked against (_check).
        await self._block(self.timer, [], one_set=one_set)
        block = await self._block(candidate, [], one_set=one_set, check_call=0)
        if not await self._check(candidate, 0, block):
            self.run_state.flags.setdefault("stale_output", "wrong answer on new inputs after timing")

    async def _profile(self, worker: Worker) -> list[str] | None:
        if self.device != "cuda":
            return None
        nonce = secrets.token_hex(8)
        one_set = {"trial_seed": self.seed + 1, "signed": self.reference.signed[0]} if self.drawn else {"set": "0"}
        await worker.send({"op": "profile", **one_set, "nonce": nonce})
        reply = await worker.expect({"profiled", "error"}, self.deadline)
        if reply is None and time.monotonic() >= self.deadline:
            raise CandidateFailure  # the time ran out, whoever was running (as in _command)
        if reply is None or reply["event"] == "error" or reply.get("nonce") != nonce:
            if worker is self.timer:
                raise EvaluatorFailure(f"the reference could not be profiled: {(reply or {}).get('message')}")
            raise CandidateFailure
        kernels = reply.get("kernels")
        return [k for k in kernels if isinstance(k, str)] if isinstance(kernels, list) else []


def hides_work(reference: list[Block], candidate: list[Block]) -> str:
    """What the judge saw where the candidate's blocks leave more time unexplained by their report than the
    reference's do, beyond chance and beyond the slack (_slower_beyond_chance), by the judge's clock or by the wall
    clock; or "".

    Both sides run the same calls on the same inputs, so what the clocks see beyond the reported times (the pipe,
    the inputs' checks, being scheduled) has one distribution on both sides; load moves single blocks, not the ranks
    of all of them. On a CPU the judge's clock is CPU time, which a helper process that exits before the reply takes
    with it: a red-team candidate whose helpers computed its outputs after each timed call returned (its main thread
    asleep meanwhile) left the CPU clock nothing to see and scored correct at 1.9-8.8x; the block's wall time sees
    that (on a GPU the two clocks are one)."""
    for clock, ours, theirs, block_s in (
        (
            "the judge's clock",
            [b.unexplained_s for b in candidate],
            [b.unexplained_s for b in reference],
            statistics.median(b.clocked_s for b in candidate),
        ),
        (
            "the wall clock",
            [b.unexplained_wall_s for b in candidate],
            [b.unexplained_wall_s for b in reference],
            statistics.median(b.wall_s for b in candidate),
        ),
    ):
        seen = _slower_beyond_chance(ours, theirs, UNEXPLAINED_SHARE * block_s + UNEXPLAINED_SLACK_S, block_s)
        if seen:
            return (
                f"{clock} leaves {statistics.median(ours) * 1e3:.3f} ms per block (median) unexplained by the "
                f"candidate's reported times, against {statistics.median(theirs) * 1e3:.3f} ms for the reference, "
                f"{seen}: work off the timed stream, or a false report"
            )
    return ""


def _memory_out_of_reach(error: OSError, access: str) -> EvaluatorFailure:
    """The service's own failure to `access` ("read", "write") a worker's memory, which it could not at start-up
    either: not the job's doing."""
    return EvaluatorFailure(
        f"the judge cannot {access} the worker's memory ({error}): the service needs CAP_SYS_PTRACE in strict "
        f"isolation, or a kernel whose Yama lets it {access} its children's memory in process isolation"
    )


def slower_outside_calls(reference: list[Block], candidate: list[Block], threads: int = 1) -> str:
    """Which step around the timed calls (drawing the inputs, the digest, or those with the rest of the block) took
    the candidate longer than the reference beyond chance (_slower_beyond_chance), by the judge's clock or by the wall
    clock, or "". Both run the same code there, so more time is work moved out of the timed calls: answers computed
    while the inputs were drawn, or only when the digest asked for them. On a CPU the judge's clock is CPU time
    (divided by the worker's torch `threads`), and a process that exits before the reply takes its CPU time with it;
    work done there still takes wall time (on a GPU the two clocks are one).

    The draw's time by the judge's clock is not flagged: it is counted in the candidate's samples
    (charged_outside_calls), so work moved there buys nothing, and the same drawing code's CPU time depends on the
    machine too much to tell such work from chance (on a 2-core machine a block's 64x64 draws ran at about 25 or
    about 45 us each, block by block, in both workers; honest candidates' draws cost them 13-17 % more than the
    reference timer's in every block of three rounds in two CI runs, and 2.5 times as much in a third, and were
    rejected while it was flagged).
    The wall clock looks at the draw's time off the CPU beyond what its CPU time explains (its wall time less its CPU
    time scaled as the reference's draws are), which a process that draws slower on the CPU does not change, loaded
    machine or not."""

    # Off the CPU as the reference's draws are: a loaded machine makes every draw wait for a core in proportion to
    # its CPU time, so a draw slower on the CPU waits longer too.
    waits = [b.drawn_wall_s / (b.drawn_s * threads) for b in reference if b.drawn_s > 0]
    wall_per_cpu_s = statistics.median(waits) if waits else 1.0

    def draw_off_cpu(block: Block) -> float:
        return block.drawn_wall_s - block.drawn_s * threads * wall_per_cpu_s

    judges_clock: list[tuple[str, Callable[[Block], float]]] = [
        ("the output digest", lambda b: b.digest_s),
        ("the digest and the time after the calls together", lambda b: b.unexplained_s + b.digest_s),
    ]
    # Each step, then steps together: work moved into the draw in some blocks and into the digest, or past the end
    # of the timed calls (hides_work), in others, too few blocks of each to see alone (a red-team candidate split 16
    # of 20 blocks between the draw and the time after its calls returned, 8 each, and scored correct at 1.3x and
    # 3.0x).
    wall_clock: list[tuple[str, Callable[[Block], float]]] = [
        ("drawing the inputs (off the CPU)", draw_off_cpu),
        ("the output digest", lambda b: b.digest_wall_s),
        ("drawing the inputs (off the CPU) and the digest together", lambda b: draw_off_cpu(b) + b.digest_wall_s),
        (
            "all the time around the timed calls (drawing off the CPU, the block, the digest)",
            lambda b: draw_off_cpu(b) + b.unexplained_wall_s + b.digest_wall_s,
        ),
    ]
    for clock, steps, block_s in (
        ("the judge's clock", judges_clock, statistics.median(b.clocked_s for b in candidate)),
        ("the wall clock", wall_clock, statistics.median(b.wall_s for b in candidate)),
    ):
        for step, value in steps:
            ours, theirs = [value(b) for b in candidate], [value(b) for b in reference]
            # The slack is at least hides_work's (5 % of the block: an honest candidate's steps around its calls may
            # cost it a little more than the reference's in every block), and never below CLOCKED_SHARE of the
            # candidate's block, the room a report has anyway (judge_room_s): less work moved buys at most
            # 1 / (1 - CLOCKED_SHARE) of speed.
            scale = max(statistics.median(ours), block_s)
            slack = max(UNEXPLAINED_SHARE * scale, CLOCKED_SHARE * block_s) + UNEXPLAINED_SLACK_S
            seen = _slower_beyond_chance(ours, theirs, slack, block_s)
            if seen:
                return (
                    f"{step} took {statistics.median(ours) * 1e3:.3f} ms per block (median) by {clock} against "
                    f"{statistics.median(theirs) * 1e3:.3f} ms for the reference, {seen}: work moved out of the "
                    f"timed calls (per block, candidate / reference medians in ms: "
                    f"{_steps_breakdown(candidate, reference, draw_off_cpu)})"
                )
    return ""


def _steps_breakdown(candidate: list[Block], reference: list[Block], draw_off_cpu: Callable[[Block], float]) -> str:
    """Every step's median on both sides, so that a flag can be read back to the step (and clock) that raised it."""
    steps: list[tuple[str, Callable[[Block], float]]] = [
        ("block, wall", lambda b: b.wall_s),
        ("its calls", lambda b: sum(b.ms) / 1e3),
        ("beyond them, wall", lambda b: b.unexplained_wall_s),
        ("beyond them, judge's clock", lambda b: b.unexplained_s),
        ("draw, wall", lambda b: b.drawn_wall_s),
        ("draw, judge's clock", lambda b: b.drawn_s),
        ("draw off the CPU", draw_off_cpu),
        ("digest, wall", lambda b: b.digest_wall_s),
        ("digest, judge's clock", lambda b: b.digest_s),
    ]
    return "; ".join(
        f"{name} {statistics.median(value(b) for b in candidate) * 1e3:.3f} / "
        f"{statistics.median(value(b) for b in reference) * 1e3:.3f}"
        for name, value in steps
    )


def charged_outside_calls(
    reference: list[Block], candidate: list[Block], candidate_ms: list[float], threads: int = 1
) -> list[float]:
    """The candidate's per-call samples (one per block, in block order) with the CPU time its draw took beyond the
    reference's median counted in, block by block; the samples as they are where that does not raise their median.

    Both sides run the same code there, so more time is work moved out of the timed calls, or a process that draws
    slower than the reference's timer (an honest candidate's did by up to 17 % in every block of a CI run, for a
    reason not found): either way the speedup is of the whole cycle's extra time, and the flag
    (slower_outside_calls) can leave the draw's time by this clock a wide slack. Block by block, so work moved into
    some blocks' draws is charged to those blocks, whose samples the median takes. The judge's clock is divided by
    the worker's `threads`; the draw runs on one, so a thread working beside it would be charged a fraction: here
    the CPU time counts whole. Only the draw: the digest's time varies between two processes by far more (medians
    of 3.6 and 5.7 ms a block in one evaluation of identical code), and is held to the flag's narrow slack.

    Charged only where the candidate's draws are slower beyond chance (CHARGE_Z): each honest draw varies by a few
    per cent, which on a small problem is several per cent of its calls' time (identical code scored 0.85-1.02x
    here, mean 0.92, when every block's excess was charged). Less than that noise moved into every draw goes
    uncharged; work moved into just over half of the blocks, which sets the median, ranks at z 2.96. The draws of
    the blocks whose samples set the median (those at or below it) pass the gate on their own as well: a candidate
    that skipped the draw in the other blocks (drawing those inputs in its timed calls, which the median leaves
    out) keeps all its draws' ranks near chance, and a simulated one, with work moved into the other 11 of 20
    blocks' draws, was charged only beyond the reference's slowest draw (1.3-1.5x with draws of 3-10 % noise, up to
    10x with draws of two speeds, as a 2-core machine's are)."""
    theirs_draws = [b.drawn_s for b in reference]
    median_ms = statistics.median(candidate_ms)
    setting = [b.drawn_s for ms, b in zip(candidate_ms, candidate, strict=True) if ms <= median_ms]
    if max(_rank_z([b.drawn_s for b in candidate], theirs_draws), _rank_z(setting, theirs_draws)) > CHARGE_Z:
        theirs = statistics.median(theirs_draws) * threads
    else:
        # Below the gate, each block's draw beyond the slowest of the reference's: work moved into exactly half of a
        # round's blocks (5 of 10, whose median is the mean of the 5th and 6th) ranks at z 1.1, and a red-team
        # candidate doing so scored 2.0-5.6x uncharged; chance puts about one honest block a round there, by little.
        theirs = max(theirs_draws) * threads
    charged = [
        max(0.0, ms + (b.drawn_s * threads - theirs) * 1e3 / len(b.ms))
        for ms, b in zip(candidate_ms, candidate, strict=True)
    ]
    return charged if statistics.median(charged) > statistics.median(candidate_ms) else candidate_ms


def _slower_beyond_chance(ours: list[float], theirs: list[float], slack: float, block_s: float) -> str:
    """Where `ours` (the candidate's blocks) is slower than `theirs` (the reference's) beyond chance, by either of
    two tests at about p = 0.001, each with a difference beyond `slack`:
    - ranks: a one-sided Mann-Whitney test (normal approximation), ours above theirs in nearly every pair (z above
      UNEXPLAINED_Z), the medians apart by more than the slack: work moved out of every block;
    - the slowest blocks: the k slowest of both sides all ours, which chance makes as likely as C(n, k) / C(n + m,
      k) (the sides alternate, so a burst of load falls on both), the k-th of them above the slowest of theirs by
      more than the slack and MAX_ROOM_SHARE of the candidate's median block (`block_s`): work moved out of some
      blocks. Just over half of 20 sets the median, and so the speedup, while the ranks of all pairs stay below z
      3.09 (2.96); 11 such blocks in a row come by chance once in 14,000. Less work than that per block buys no
      more than the room a report has anyway (1 / (1 - MAX_ROOM_SHARE)), and an honest candidate's own hiccups
      in some blocks (an allocation the reference's process did not need) stay below it.
    The test that saw it ("in nearly every pair of blocks", "in its k slowest blocks ..."), or ""."""
    n, m = len(ours), len(theirs)
    if not n or not m:
        return ""
    if _rank_z(ours, theirs) > UNEXPLAINED_Z and statistics.median(ours) - statistics.median(theirs) > slack:
        return "in nearly every pair of blocks"
    slowest_theirs = max(theirs)
    above = sorted((v for v in ours if v > slowest_theirs), reverse=True)
    for k in range(len(above), 0, -1):  # the longest run of ours at the top that clears the slack
        if above[k - 1] - slowest_theirs > max(slack, MAX_ROOM_SHARE * block_s):
            if math.comb(n, k) / math.comb(n + m, k) >= SLOWEST_BLOCKS_P:
                return ""
            return f"in its {k} slowest of {n} blocks, each slower than any of the reference's {m}"
    return ""


def _rank_z(ours: list[float], theirs: list[float]) -> float:
    """How far `ours` lies above `theirs`: a one-sided Mann-Whitney test's z (normal approximation)."""
    n, m = len(ours), len(theirs)
    wins = sum(1.0 if c > r else 0.5 if c == r else 0.0 for c in ours for r in theirs)
    spread = math.sqrt(n * m * (n + m + 1) / 12)
    return (wins - n * m / 2 - 0.5) / spread if spread else 0.0


def judge_room_s(reference: list[Block], clocked_s: float) -> float:
    """Seconds per block by which a report may fall short of the judge's clock unseen: three times the median
    absolute deviation of the reference's overhead (its process is honest, so this is noise), 10 % of the block
    and the slack. Longer blocks keep it under a quarter of the candidate's block where they can (room_share)."""
    overhead = statistics.median(b.unexplained_s for b in reference)
    jitter = statistics.median(abs(b.unexplained_s - overhead) for b in reference)
    return JITTER_FACTOR * jitter + CLOCKED_SHARE * clocked_s + UNEXPLAINED_SLACK_S


def room_share(blocks: dict[str, list[Block]]) -> float:
    """The room a report has below the judge's clock (judge_room_s) as a share of the candidate's own time per
    block by that clock. At most MAX_ROOM_SHARE, a report can claim at most a third more speed than it has; above,
    the judge cannot check a report to that precision."""
    reference, candidate = blocks["reference"], blocks["candidate"]
    if not reference or not candidate:
        return 0.0
    overhead = statistics.median(b.unexplained_s for b in reference)
    clocked = max(1e-6, statistics.median(b.clocked_s - overhead for b in candidate))
    return judge_room_s(reference, clocked) / clocked


def judge_clocked_ms(reference: list[Block], candidate: list[Block]) -> list[float] | None:
    """The candidate's per-call samples by the judge's clock, where its report is faster than that clock allows.

    A block by the judge's clock less the reference's median overhead (the pipe, the inputs' checks: the same on
    both sides) is an estimate of the candidate's time for the block. A report below it by more than
    `judge_room_s` is not believed, and the judge's estimate replaces it. None when the report holds."""
    overhead = statistics.median(b.unexplained_s for b in reference)
    reported = statistics.median(sum(b.ms) / 1e3 for b in candidate)
    clocked = statistics.median(b.clocked_s - overhead for b in candidate)
    if reported >= clocked - judge_room_s(reference, clocked):
        return None
    return [max(0.0, b.clocked_s - overhead) * 1e3 / len(b.ms) for b in candidate]


def judge_timing(
    blocks: dict[str, list[Block]],
    reference: ReferenceData,
    ready: dict[str, Any],
    request: EvaluateRequest,
    kernels: list[str] | None,
    share: float = 0.0,
    threads: int = 1,
) -> TimingResult:
    """Per-call milliseconds of each side (one sample per block) and the flags the judge's clock raises.
    `threads`: what the judge's clock is divided by (on a CPU, the workers' torch threads)."""
    ref_blocks, cand_blocks = blocks["reference"], blocks["candidate"]
    flags: dict[str, str] = {}
    if ref_blocks and cand_blocks:
        if any(b.wall_s - sum(b.ms) / 1e3 < -1e-3 for b in cand_blocks):
            flags["implausible_timing"] = "the reported times exceed the time that elapsed"
        elif moved := slower_outside_calls(ref_blocks, cand_blocks, threads):
            flags["implausible_timing"] = moved
        elif hidden := hides_work(ref_blocks, cand_blocks):
            flags["implausible_timing"] = hidden
    candidate_ms = [b.per_call_ms for b in cand_blocks]
    ref_ms = [b.per_call_ms for b in ref_blocks]
    if ref_blocks and cand_blocks and "implausible_timing" not in flags:
        clocked = judge_clocked_ms(ref_blocks, cand_blocks)
        if clocked is not None:
            candidate_ms = clocked
            flags["timed_by_judge"] = (
                "the candidate's reported times are faster than the judge's clock allows; its samples are the "
                "judge's (each block's wall time less the reference's median overhead, per call)"
            )
        charged = charged_outside_calls(ref_blocks, cand_blocks, candidate_ms, threads)
        if statistics.median(charged) > (1 + UNEXPLAINED_SHARE) * statistics.median(candidate_ms):
            flags["charged_outside_calls"] = (
                f"drawing the inputs took the candidate longer than the reference (median "
                f"{statistics.median(candidate_ms):.4f} ms per call before, {statistics.median(charged):.4f} ms "
                "after counting it in): the extra time is counted in its samples"
            )
        candidate_ms = charged
        if clocked is None and share >= 1 and statistics.median(candidate_ms) < statistics.median(ref_ms):
            # The judge cannot tell whether the candidate's calls took any time at all: a report it cannot check
            # buys no speed. Up to the reference's, it stands; beyond, it is cut. (Below a share of 1, a false
            # report gains at most 1 / (1 - share) by the room judge_clocked_ms leaves it.)
            ceiling = statistics.median(ref_ms)
            candidate_ms = [max(ms, ceiling) for ms in candidate_ms]
            flags["unverified_timing"] = (
                f"the judge's clock could check the reported times only to {share:.0%} of the candidate's time: the "
                "calls are short against the noise of the work around them (drawing inputs, the digest, the "
                "machine's load), so no speed beyond the reference's is credited"
            )
    bandwidth = ready.get("bandwidth_gbs")
    if isinstance(bandwidth, int | float) and bandwidth > 0 and candidate_ms:
        floor = gpu_checks.physical_floor_ms(reference.inputs[0], float(bandwidth))
        median = statistics.median(candidate_ms)
        if gpu_checks.beyond_physical_bound(median, floor, 0.5):
            flags["beyond_physical_bound"] = (
                f"{median:.4f} ms is under half the {floor:.4f} ms it takes to read the inputs once at "
                f"{bandwidth:.0f} GB/s"
            )
    if kernels is not None:
        own = gpu_checks.own_kernel_names(request.candidate_source)
        if not gpu_checks.launches_own_kernel(kernels, own):
            flags["no_custom_kernel"] = (
                f"launched only {', '.join(kernels[:8]) or 'no kernels'}; own kernels: {', '.join(sorted(own)) or 'none'}"
            )
    return TimingResult(
        reference_ms=ref_ms,
        candidate_ms=candidate_ms,
        calls_per_sample=len(cand_blocks[0].ms) if cand_blocks else 0,
        flags=flags,
        device=str(ready.get("device", "")),
    )


def _hand_over(worker: Worker, reference: ReferenceData, trials: range) -> None:
    """Give a worker its inputs (never the expected outputs), in files it can read but not change."""
    inputs_dir = sandbox.make_dir(worker.home / "inputs", 0o755)
    worker.charge_service_write(len(reference.init_bytes))
    write_readonly_file(inputs_dir / "init.pt", reference.init_bytes)
    for trial in trials:
        worker.charge_service_write(len(reference.input_bytes[trial]))
        write_readonly_file(inputs_dir / f"inputs_{trial}.pt", reference.input_bytes[trial])
    inputs_dir.chmod(0o555)


class _SavedOutputRefusedError(Exception):
    """An output a candidate saved for a check that the service would not copy to the reference's timer."""

    def __init__(self, why: str, disk_full: bool) -> None:
        super().__init__(why)
        self.disk_full = disk_full


class _ForeignInputsError(OSError):
    """A worker's `inputs` directory is not the one the service made."""


# Errors of a copy into a worker's `inputs` that come from the service's side (its disk failing), not from the
# candidate's file: the judge's failure, never the candidate's verdict. A full disk is not among them: where jobs
# share one (process isolation, or EVALUATOR_JOB_DISK_MB=0) a job can fill the filesystem its home shares with the
# timer's `inputs`, and it would then choose `evaluator_error` (no penalty) for itself; the failed copy counts
# against the candidate instead. Where each job has its own disk, the service's writes of inputs to the timer's
# disk are the judge's; a copy of the candidate's file there is not (the candidate sets its size).
_JUDGE_SIDE_ERRNOS = frozenset({errno.EIO})
DISK_FULL = "the disk the job shares with the judge is full"


@contextlib.contextmanager
def _writable_inputs(worker: Worker) -> Iterator[int]:
    """A handle on the service's own `inputs` directory of a worker, writable while the block runs. Opened beneath
    the worker's root, never by path (the job owns `home` and may have swapped `inputs` for a directory or links of
    its own): _ForeignInputsError if its owner is not the service. The directory is read-only otherwise (0555,
    _hand_over); a service that is not root (process isolation) needs its owner's write bit back to change it."""
    directory = open_beneath(worker.root, "home/inputs", directory=True)
    try:
        if os.fstat(directory).st_uid != os.geteuid():
            raise _ForeignInputsError("the inputs directory is not the one the service made")
        os.fchmod(directory, 0o755)
        try:
            yield directory
        finally:
            os.fchmod(directory, 0o555)
    finally:
        os.close(directory)


def _judge_side(error: OSError, what: str) -> None:
    if error.errno in _JUDGE_SIDE_ERRNOS:
        raise EvaluatorFailure(f"{what}: {error}") from error


def _hand_over_check(candidate: Worker, timer: Worker, check: int, limit: int) -> None:
    """Copy the output file a candidate saved for a check into the timer's `inputs` (_writable_inputs), from the
    candidate's file opened without following links (safe_files). OSError or ValueError: the candidate's file is
    not a single regular file of its own within `limit`; EvaluatorFailure: the copy failed on the service's side."""
    # Charged at the most it can be until its size is known: never less than the copy holds (MemoryWatch).
    timer.charge_service_write(limit)
    try:
        with _writable_inputs(timer) as directory:
            copied = copy_file_beneath(
                candidate.root, f"home/checks/{check}/0.pt", f"check_{check}.pt", limit, candidate.uid,
                dir_fd=directory,
            )  # fmt: skip
        timer.charge_service_write(copied)
    except _ForeignInputsError as error:
        raise EvaluatorFailure(f"the reference timer's {error}") from error
    except OSError as error:
        _judge_side(error, "the output saved for a check could not be copied to the reference timer")
        raise
    finally:
        timer.release_service_write(limit)


class _TimerSocketError(OSError):
    """The service could not send on the reference's timer's handover socket."""


def _pass_handover(candidate: Worker, timer: Worker, check: int, nonce: str, described: list[Any]) -> None:
    """Pass the device handover a candidate queued for the save with `nonce` on to the timer, for check `check`
    (device_handover). HandoverError where the candidate's is not one (no message of that save, descriptors that are
    not GPU allocations, or a description other than its reply's); _TimerSocketError where the timer's socket
    failed."""
    if candidate.handover is None or timer.handover is None:
        raise device_handover.HandoverError("a handover from a worker without a handover socket")
    header, fds = device_handover.receive_for(candidate.handover, nonce)
    try:
        if header.get("tensors") != described:
            raise device_handover.HandoverError("a handover other than the one the save's reply described")
        try:
            device_handover.send(timer.handover, {"check": check, "tensors": described}, fds)
        except OSError as error:
            raise _TimerSocketError(str(error)) from error
    finally:
        device_handover.close_all(fds)


def _copy_to_timer(timer: Worker, check: int, limit: int, copy: Callable[[Callable[[bytes], object]], None]) -> None:
    """Have `copy` write the judge's copy of a checked output (through the write function it is given, within
    `limit` bytes) into the timer's `inputs` as `check_<check>.raw` (_writable_inputs), read-only once written.
    _SavedOutputRefusedError where the disk is full (the candidate's doing, as in _timer_check: it sets the size);
    EvaluatorFailure where the copy failed otherwise on the service's side. A failed read (held_memory's
    UnreadableMemory, or an OSError where the job's processes are gone) is raised as it is, the partial copy
    removed."""
    timer.charge_service_write(limit)
    name = f"check_{check}.raw"
    try:
        with _writable_inputs(timer) as directory:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                target = os.open(name, flags, 0o600, dir_fd=directory)
            except OSError as error:
                raise _CopyWriteError(error) from error

            def write(chunk: bytes) -> None:
                # Unbuffered: a buffered file's flush at close would raise a full disk outside this wrapper.
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[os.write(target, view) :]
                    except OSError as error:
                        raise _CopyWriteError(error) from error

            try:
                copy(write)
                try:
                    os.fchmod(target, 0o444)
                except OSError as error:
                    raise _CopyWriteError(error) from error
                timer.charge_service_write(os.fstat(target).st_size)
            except BaseException:
                os.unlink(name, dir_fd=directory)
                raise
            finally:
                os.close(target)
    except _ForeignInputsError as error:
        raise EvaluatorFailure(f"the reference timer's {error}") from error
    except _CopyWriteError as failure:
        if failure.error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _SavedOutputRefusedError(DISK_FULL, disk_full=True) from failure.error
        raise EvaluatorFailure(
            f"a checked output could not be copied to the reference timer: {failure.error}"
        ) from None
    finally:
        timer.release_service_write(limit)


class _CopyWriteError(Exception):
    """A write of the judge's copy into the timer's `inputs` failed: the service's side, unlike the read before it."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _remove_check(timer: Worker, name: str) -> None:
    """Remove a check's copy (_hand_over_check, _copy_to_timer) once the timer has compared it: a long timing run
    makes many."""
    # Its charge (MemoryWatch) stays: the timer maps the copy, whose pages outlive the name while a mapping does.
    with _writable_inputs(timer) as directory, contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)


def _job_cpu_clocks(worker: Worker) -> dict[int, float]:
    """CPU seconds used so far by a worker's job (as _jobs_clocks)."""
    pids = [] if worker.cgroup is not None else sandbox.job_pids(worker.uid, [worker.proc.pid])
    return _jobs_clocks([worker], pids)


def _jobs_clocks(workers: list[Worker], pids: list[int]) -> dict[int, float]:
    """CPU seconds used so far by the workers' jobs. Where every job has a cgroup (job_cgroup), one clock per job,
    keyed by its worker's pid negated: the group's, which keeps the time of every process the job ran, those that
    exited too. Otherwise the kernel's clock of each process of `pids` (those of the jobs): a process that exits
    takes its time with it (_cpu_used_s)."""
    cgroups = {worker.proc.pid: worker.cgroup for worker in workers if worker.cgroup is not None}
    if not workers or len(cgroups) < len(workers):
        return _cpu_clocks(pids)
    clocks = {}
    for pid, cgroup in cgroups.items():
        with contextlib.suppress(OSError, ValueError):  # a worker already disposed of
            clocks[-pid] = cgroup.cpu_s()
    return clocks


def _cpu_clocks(pids: list[int]) -> dict[int, float]:
    """Each process's CPU clock (every thread, those that exited too), in seconds."""
    clocks = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            clocks[pid] = time.clock_gettime(((~pid) << 3) | 2)  # the process's CPUCLOCK_SCHED clock id
    return clocks


def _cpu_used_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the job used between two readings (_jobs_clocks), per clock: a process that exited meanwhile
    (where the job has no cgroup) takes what it used since `before` with it, but never what it had used until then
    (a sum of totals would subtract that, so a helper that burned CPU earlier and exits in a block would shorten
    the block's clock). A pid reused meanwhile counts from 0 at worst."""
    return sum(max(0.0, seconds - before.get(pid, 0.0)) for pid, seconds in after.items())


def _stop_and_clock(*workers: Worker) -> tuple[list[sandbox.JobStop], dict[int, float]]:
    """Stop every process of the workers' jobs (SIGSTOP); what each stop found and their CPU clocks (as
    _job_cpu_clocks), read once they are stopped and off their CPUs."""
    stops = _stop_jobs(list(workers))
    return stops, _jobs_clocks(list(workers), [pid for stop in stops for pid in stop.pids])


def _read_since_stops(
    workers: list[Worker], stops: list[sandbox.JobStop], pids: list[int], check: bool
) -> tuple[dict[int, float], str]:
    """The jobs' CPU clocks now (_jobs_clocks) and, where `check`, what shows that one ran since its stop
    (sandbox.ran_since_stop), "" if nothing."""
    ran = next(filter(None, map(sandbox.ran_since_stop, stops)), "") if check else ""
    return _jobs_clocks(workers, pids), ran


def _resume(workers: list[Worker], pids: list[int]) -> None:
    """SIGCONT what _stop_jobs stopped: nothing of those jobs ran since (a stopped process cannot fork), so no
    scan is needed; in strict isolation the signaller also reaches a child whose fork was under way at the stop."""
    for worker in workers:
        if worker.signaller is not None and worker.uid is not None:
            worker.signaller.signal(worker.uid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.proc.pid, signal.SIGCONT)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def _stop_jobs(workers: list[Worker]) -> list[sandbox.JobStop]:
    """Stop every process of the workers' jobs (sandbox.stop_job). A job that resists a stop is killed: its next
    command fails, and its verdict says why."""
    stops = []
    for worker in workers:
        try:
            stops.append(sandbox.stop_job(worker.uid, worker.proc.pid, worker.signaller))
        except sandbox.UnstoppableJobError as error:
            worker.killed_for = f"resisting the judge's stop ({error})"
            sandbox.kill_all(worker.uid, worker.proc.pid, worker.signaller)
    return stops


def _hand_over_one(worker: Worker, reference: ReferenceData, trial: int) -> str:
    """One more input set for a worker whose code has run, written into its `inputs` (_writable_inputs). "" when
    written, DISK_FULL when the disk was (_JUDGE_SIDE_ERRNOS: the job may have filled it), another reason if that
    directory is not the one the service made; EvaluatorFailure if the write failed on the service's side."""
    try:
        with _writable_inputs(worker) as directory:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            worker.charge_service_write(len(reference.input_bytes[trial]))  # a part written stays: never released
            with os.fdopen(os.open(f"inputs_{trial}.pt", flags, 0o444, dir_fd=directory), "wb") as handle:
                handle.write(reference.input_bytes[trial])
        return ""
    except OSError as error:
        _judge_side(error, "an input set could not be handed over")
        return DISK_FULL if error.errno in (errno.ENOSPC, errno.EDQUOT) else str(error) or "not written"


def _names(value: Any) -> set[str]:
    return {name for name in value if isinstance(name, str)} if isinstance(value, list) else set()


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(item) for item in value)
    return 8


def _bare(status: EvaluationStatus, message: str, flags: list[str] | None = None) -> EvaluationResult:
    return EvaluationResult(status=status, compiled=False, correct=False, message=printable(message), flags=flags or [])


__all__ = ["HACK_FLAGS", "Comparison", "Evaluator", "EvaluatorFailure", "InvalidRequestError"]
