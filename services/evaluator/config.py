"""Settings of the evaluator service, read from `EVALUATOR_*` environment variables."""

from __future__ import annotations

import importlib.metadata
import json
import os
import secrets
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Isolation = Literal["process", "strict"]
DataPath = Literal["files", "drawn"]

# Flags that mean the candidate tried to game the evaluation; they turn the verdict into `rejected`.
HACK_FLAGS = frozenset(
    {
        "uses_reference_model",
        "monkeypatch",
        "no_custom_kernel",
        "input_mutation",
        "result_tampering",
        "implausible_timing",
        "stale_output",
        # GPU only (gpu_checks.py)
        "beyond_physical_bound",
    }
)
# Flags that say how a verdict was reached; reported, never rejecting unless listed in `reject_flags`.
ADVISORY_FLAGS = frozenset(
    {"try_except_fallback", "timed_by_judge", "unverified_timing", "charged_outside_calls", "not_timed"}
)
ALL_FLAGS = HACK_FLAGS | ADVISORY_FLAGS


def service_version() -> str:
    try:
        return importlib.metadata.version("kernel-agent")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+local"


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Settings(BaseSettings):
    """Every field maps to `EVALUATOR_<NAME>`; see docs/evaluator.md for the table."""

    # Empty variables count as unset (compose files pass `EVALUATOR_X=` through).
    model_config = SettingsConfigDict(env_prefix="EVALUATOR_", extra="ignore", env_ignore_empty=True)

    host: str = Field("127.0.0.1", description="Bind address; a non-loopback address needs `token`.")
    port: int = Field(8001, ge=1, le=65535)
    token: SecretStr | None = Field(None, description="Bearer token required on every route but /health.")
    workers: int = Field(2, ge=1, le=256, description="Evaluations that run at once; more wait in a queue.")
    max_queued: int = Field(1024, ge=1, description="Evaluations allowed to wait for a worker before HTTP 503.")
    prespawn: bool = Field(True, description="Keep one idle worker per slot with torch already imported.")
    threads_per_worker: int = Field(
        default_factory=lambda: max(1, _cpu_count() // 2),
        ge=1,
        description="torch intra-op threads of each worker (timings are per worker).",
    )
    build_workers: int = Field(
        default_factory=lambda: max(2, _cpu_count() // 2),
        ge=1,
        description="Extension builds that run at once (builder workers); one nvcc build keeps about one core busy.",
    )
    build_jobs: int = Field(default_factory=_cpu_count, ge=1, description="MAX_JOBS given to ninja per build.")
    default_timeout_s: float = Field(300.0, gt=0, le=3600, description="Wall-clock limit when a request sets none.")
    memory_limit_mb: int = Field(
        6144,
        ge=1024,
        description="Memory of one worker's job: its address space on a CPU (RLIMIT_AS), its processes' resident "
        "memory together, and where the job has a cgroup, every page the cgroup is charged (shared and file pages).",
    )
    job_cgroups: bool = Field(
        True,
        description="A cgroup per worker where the host lets the service make one (root, or a delegated cgroup v2 "
        "subtree): the kernel limits the job's memory and counts its CPU time, exited helpers included.",
    )
    max_processes: int = Field(128, ge=16, description="Processes+threads of one sandbox uid (RLIMIT_NPROC, strict).")
    max_file_mb: int = Field(2048, ge=1, description="Largest file a worker may write (RLIMIT_FSIZE).")
    job_disk_mb: int | None = Field(
        None,
        ge=0,
        description="Strict isolation: each worker's directory is a tmpfs of this many MiB, so a job that fills its "
        "disk fills its own and not the one other evaluations and the service write to. Its files are then memory "
        "the job's cgroup counts and cannot reclaim, as on a tmpfs work directory; 0 keeps job files on the work "
        "directory's filesystem, unbounded in sum. Unset: 4 x max_file_mb where the work directory is a tmpfs "
        "already (its files are memory either way), 0 elsewhere.",
    )
    isolation: Isolation | None = Field(
        None, description="`process` or `strict`; unset picks the strongest one that works on this machine."
    )
    sandbox_uid_base: int = Field(
        default_factory=lambda: 1_000_000 + secrets.randbelow(100_000) * 4096,
        ge=1000,
        description="First of the unprivileged uids used in `strict` isolation; random per start by default, so "
        "two evaluators on one machine never share a uid (jobs are cleaned up by killing their uid's processes).",
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "kernel-agent" / "evaluator",
        description="Build cache of compiled extensions; survives restarts.",
    )
    work_dir: Path | None = Field(
        None, description="Parent of the per-worker private directories; a temp dir when unset."
    )
    reject_flags: Annotated[frozenset[str], NoDecode] = Field(
        HACK_FLAGS, description="Flags that turn a verdict into `rejected` (comma-separated or a JSON list)."
    )
    max_jobs_stored: int = Field(
        1000, ge=1, description="Jobs kept for GET /evaluations/{id}; finished ones are evicted first."
    )
    message_chars: int = Field(4000, ge=200, description="Longest `message` in a result.")
    min_sample_ms: float | None = Field(
        None,
        gt=0,
        description="A timed sample (a block of calls the judge times from outside) lasts at least this long; "
        "longer samples leave a false report less room. Default 5 on a CPU (the judge's clock is CPU time) and 20 on "
        "a GPU, where the judge's clock is the wall time around the block and a loaded host's jitter is milliseconds.",
    )
    timing_cpus: list[int] | None = Field(
        None,
        description="On a GPU, the core both timed workers (reference timer and candidate, every thread) are pinned "
        "to while they are timed, one per GPU in order (a JSON list); unset: the service's last allowed cores, one per "
        "GPU; `[]`: no pinning. Launch-bound models time less noisily pinned (docs/evaluator.md).",
    )
    data_path: DataPath | None = Field(
        None,
        description="How correctness data moves. `drawn`: each worker draws a trial's inputs from its seed where it "
        "runs (on the GPU), the reference's timer keeps the expected outputs there and checks every candidate output "
        "against them; no input or expected output passes through the service. `files`: the reference's inputs and "
        "outputs are files the service keeps and hands over, and outputs are compared on the host. Unset: `drawn` on "
        "CUDA, `files` on a CPU.",
    )
    device_memory_mb: int | None = Field(
        None,
        ge=256,
        description="Device memory the evaluations on one GPU may reserve together (each reserves what its reference "
        "peaked at, twice, plus its timed blocks' data and two CUDA contexts, and waits while the GPU is full). Unset: "
        "the GPU's memory less a context for every idle worker and builder. Lower it to leave room for other "
        "processes on the GPU (a trainer).",
    )
    reference_cache_size: int = Field(
        32, ge=0, description="Reference outputs kept per (reference, seed, trials, device)."
    )

    @field_validator("reject_flags", mode="before")
    @classmethod
    def _parse_flags(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            value = (
                json.loads(text) if text.startswith("[") else [part.strip() for part in text.split(",") if part.strip()]
            )
        unknown = set(value) - ALL_FLAGS if isinstance(value, list | set | frozenset | tuple) else set()
        if unknown:
            raise ValueError(f"unknown flags {sorted(unknown)}; known: {sorted(ALL_FLAGS)}")
        return value

    def data_path_for(self, device: str) -> DataPath:
        """The data path evaluations on `device` take (`data_path`, or its default for the device)."""
        return self.data_path or ("drawn" if device == "cuda" else "files")

    @property
    def token_value(self) -> str | None:
        return self.token.get_secret_value() if self.token else None
