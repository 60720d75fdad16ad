"""One evaluation, start to finish: static checks, reference worker, candidate worker, comparison, verdict."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from services.evaluator import build_cache
from services.evaluator.backends import BACKENDS, get_backend, resolve_device
from services.evaluator.compare import compare_outputs, load_data
from services.evaluator.config import HACK_FLAGS, Settings
from services.evaluator.metrics import Metrics
from services.evaluator.pool import QueueFullError, Worker, WorkerPool, WorkerStartError
from services.evaluator.sandbox import read_regular_file, write_readonly_file
from services.evaluator.static_checks import check_candidate, reference_problems
from services.evaluator.verdict import CandidateRun, candidate_result, truncate
from shared.contracts import EvaluateRequest, EvaluationResult, EvaluationStatus

log = logging.getLogger(__name__)

# GPU-profile problems move 1 GiB tensors (plus the pickle header) per trial.
MAX_DATA_BYTES = 4 << 30
# Reference outputs larger than this are not kept in memory between requests.
MAX_CACHED_REFERENCE_BYTES = 256 << 20


class InvalidRequestError(ValueError):
    """The request cannot be evaluated as sent (HTTP 422): bad reference, unknown or absent device."""


class EvaluatorFailure(RuntimeError):  # noqa: N818 - a verdict, not a programming error
    """The evaluator could not score the candidate; becomes an `evaluator_error` result."""


@dataclass
class ReferenceData:
    """What the reference worker produced; the outputs never leave the service process."""

    init_bytes: bytes
    input_bytes: list[bytes]
    inputs: list[list[Any]]
    expected: list[Any]
    device: str
    torch_version: str

    @property
    def size(self) -> int:
        """Bytes held in memory (inputs twice: serialised and loaded)."""
        return len(self.init_bytes) + 2 * sum(map(len, self.input_bytes)) + _nbytes(self.expected)


class Evaluator:
    """Runs evaluations on a WorkerPool; plain asyncio, no FastAPI."""

    def __init__(self, settings: Settings, pool: WorkerPool, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        self._references: OrderedDict[str, ReferenceData] = OrderedDict()
        # References being computed: requests for the same (reference, seed) wait for one run instead of each
        # starting a worker (a trainer sends a whole GRPO group with one seed at once).
        self._computing: dict[str, asyncio.Future[ReferenceData]] = {}

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
            phases = {"queued": started - queued_at, "reference": time.monotonic() - started}
            run = await self._run_candidate(request, device, seed, deadline, reference, check.flags)
        result = candidate_result(run, self.settings.reject_flags, self.settings.message_chars)
        return result.model_copy(
            update={
                "device": result.device or reference.device,
                "torch_version": reference.torch_version,
                "phases_s": {name: round(seconds, 4) for name, seconds in {**phases, **run.phases()}.items()},
            }
        )

    async def _reference(self, request: EvaluateRequest, device: str, seed: int, deadline: float) -> ReferenceData:
        key = hashlib.sha256(
            f"{device}\0{seed}\0{request.correctness_trials}\0{request.reference_source}".encode()
        ).hexdigest()
        while True:
            if key in self._references:
                self._references.move_to_end(key)
                return self._references[key]
            pending = self._computing.get(key)
            if pending is None:
                break
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request was cancelled, not the one computing
                # the request computing it went away: look again, compute it here if nobody else does
        computing: asyncio.Future[ReferenceData] = asyncio.get_running_loop().create_future()
        self._computing[key] = computing
        try:
            reference = await self._run_reference(request, device, seed, deadline)
        except asyncio.CancelledError:
            computing.cancel()
            raise
        except BaseException as exc:
            computing.set_exception(exc)
            computing.exception()  # retrieved: nobody may be waiting
            raise
        else:
            computing.set_result(reference)
        finally:
            del self._computing[key]
        if 0 < reference.size <= MAX_CACHED_REFERENCE_BYTES and self.settings.reference_cache_size > 0:
            self._references[key] = reference
            while len(self._references) > self.settings.reference_cache_size:
                self._references.popitem(last=False)
        return reference

    async def _run_reference(self, request: EvaluateRequest, device: str, seed: int, deadline: float) -> ReferenceData:
        if self.metrics is not None:
            self.metrics.reference_runs.inc()
        job = {
            "role": "reference",
            "reference_source": request.reference_source,
            "seed": seed,
            "trials": request.correctness_trials,
        }
        async with self.pool.worker(device) as worker:
            await worker.send(job)
            outcome = await worker.finish(deadline)
            error = worker.find("error")
            if outcome.timed_out:
                raise EvaluatorFailure("the reference did not finish within the time limit")
            if error is not None or worker.find("result") is None:
                detail = error.get("message", "") if error else f"{outcome.describe_exit()}\n{outcome.stdio_tail}"
                raise EvaluatorFailure(f"the reference failed: {detail}")
            return await asyncio.to_thread(self._read_reference, worker, request.correctness_trials)

    def _read_reference(self, worker: Worker, trials: int) -> ReferenceData:
        result = worker.find("result") or {}
        try:
            input_bytes = [read_regular_file(worker.home / f"inputs_{t}.pt", MAX_DATA_BYTES) for t in range(trials)]
            expected = [
                load_data(read_regular_file(worker.home / f"expected_{t}.pt", MAX_DATA_BYTES)) for t in range(trials)
            ]
            init_bytes = read_regular_file(worker.home / "init.pt", MAX_DATA_BYTES)
            inputs = [load_data(data) for data in input_bytes]
        except Exception as exc:
            raise EvaluatorFailure(f"the reference's outputs are unreadable: {type(exc).__name__}: {exc}") from exc
        return ReferenceData(
            init_bytes,
            input_bytes,
            inputs,
            expected,
            str(result.get("device", "")),
            str(result.get("torch_version", "")),
        )

    async def _run_candidate(
        self,
        request: EvaluateRequest,
        device: str,
        seed: int,
        deadline: float,
        reference: ReferenceData,
        static_flags: list[str],
    ) -> CandidateRun:
        job = {
            "role": "candidate",
            "candidate_source": request.candidate_source,
            "reference_source": request.reference_source,
            "seed": seed,
            "trials": request.correctness_trials,
            "timing_trials": request.timing_trials,
            "warmup_trials": request.warmup_trials,
            "min_sample_ms": self.settings.min_sample_ms,
            "require_custom_kernel": request.require_custom_kernel,
        }
        asked_at = time.monotonic()
        async with self.pool.worker(device) as worker:
            await asyncio.to_thread(_hand_over_inputs, worker, reference)
            job_sent_at = time.monotonic()  # before the send: the worker may answer before send() returns
            await worker.send(job)
            written = await worker.wait_for({"outputs_written"}, deadline)
            comparison, go_sent_at, timed, compare_s = None, None, False, None
            if written is not None:
                compare_started = time.monotonic()
                comparison = await asyncio.to_thread(
                    compare_outputs,
                    worker.home / "out",
                    reference.expected,
                    reference.inputs,
                    request.atol,
                    request.rtol,
                    MAX_DATA_BYTES,
                )
                compare_s = time.monotonic() - compare_started
                hacked = bool(written.get("replaced")) or comparison.input_mutation
                timed = comparison.correct and request.timing_trials > 0 and not hacked
                go_sent_at = time.monotonic()
                await worker.send({"time": timed})
            outcome = await worker.finish(deadline)
            run = CandidateRun(
                list(worker.events),
                outcome,
                comparison,
                timed,
                go_sent_at,
                list(static_flags),
                startup_s=job_sent_at - asked_at,
                job_sent_at=job_sent_at,
                compare_s=compare_s,
            )
            if comparison is not None and comparison.correct and not HACK_FLAGS & set(run.flags()[0]):
                await asyncio.to_thread(self._publish_builds, worker)
        return run

    def _publish_builds(self, worker: Worker) -> None:
        for event in worker.events:
            if event.get("event") == "built" and isinstance(event.get("files"), dict):
                if not build_cache.publish(
                    self.settings.cache_dir, worker.home / "build", str(event.get("key")), event["files"]
                ):
                    log.warning("build %s was not published to the cache", event.get("key"))


def _hand_over_inputs(worker: Worker, reference: ReferenceData) -> None:
    """Give the candidate its inputs (never the expected outputs), in files it can read but not change."""
    inputs_dir = worker.home / "inputs"
    inputs_dir.mkdir(mode=0o755)
    write_readonly_file(inputs_dir / "init.pt", reference.init_bytes)
    for trial, data in enumerate(reference.input_bytes):
        write_readonly_file(inputs_dir / f"inputs_{trial}.pt", data)
    inputs_dir.chmod(0o555)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(item) for item in value)
    return 8


def _bare(status: EvaluationStatus, message: str, flags: list[str] | None = None) -> EvaluationResult:
    return EvaluationResult(status=status, compiled=False, correct=False, message=message, flags=flags or [])
