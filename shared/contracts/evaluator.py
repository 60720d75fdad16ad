"""Wire contract of the evaluator service (`/evaluate`, `/evaluate/batch`, `/evaluations`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Documented size limit of one source field; larger sources get HTTP 413.
MAX_SOURCE_BYTES = 256 * 1024
# Most requests one `/evaluate/batch` call may carry.
MAX_BATCH_SIZE = 64

Device = Literal["auto", "cpu", "cuda"]
BuildPath = Literal["split", "whole", "fallback"]


class EvaluationStatus(StrEnum):
    """Outcome of one evaluation.

    All but `evaluator_error` describe the candidate. `evaluator_error` means the evaluator itself failed
    (the reference did not run, the sandbox could not start): it says nothing about the candidate, and the
    trainer must never turn it into a reward.
    """

    correct = "correct"
    incorrect = "incorrect"
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    crashed = "crashed"
    rejected = "rejected"
    evaluator_error = "evaluator_error"


class EvaluateRequest(BaseModel):
    """One candidate to score against one KernelBench-format reference."""

    model_config = ConfigDict(extra="forbid")

    reference_source: str = Field(
        description="Python module defining `Model`, `get_inputs()` and `get_init_inputs()`.",
        examples=[
            "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
            "        return torch.relu(x)\n\ndef get_inputs():\n    return [torch.randn(1024)]\n\n"
            "def get_init_inputs():\n    return []\n"
        ],
    )
    candidate_source: str = Field(
        description="Python module defining `ModelNew` with the same constructor arguments as `Model`.",
        examples=[
            "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
            "        return x.clamp_min(0)\n"
        ],
    )
    device: Device = Field("auto", description="`auto` picks CUDA when the evaluator has a GPU, else CPU.")
    correctness_trials: int = Field(5, ge=1, le=100, description="Random input draws checked for correctness.")
    timing_trials: int = Field(
        100,
        ge=0,
        le=10_000,
        description="Timed calls of each model at least, in at least 50 samples (blocks of calls) where there are that "
        "many calls; 0 skips timing.",
    )
    warmup_trials: int = Field(5, ge=0, le=1_000, description="Untimed calls before timing (at least 2 run).")
    atol: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Absolute tolerance; default by dtype (fp32 1e-4, fp16/bf16 1e-2).",
    )
    rtol: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Relative tolerance; default by dtype (fp32 1e-4, fp16/bf16 1e-2).",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Wall-clock limit of the whole evaluation; server default when absent.",
    )
    seed: int | None = Field(None, ge=0, lt=2**63, description="Seed of the random inputs; random when absent.")
    require_custom_kernel: bool = Field(
        False, description="Reject candidates that launch no kernel of their own (load_inline or Triton)."
    )


class TimingStats(BaseModel):
    """Per-call latency in milliseconds: `n` samples, each the mean of one timed block of `calls_per_sample` calls."""

    median: float
    mean: float
    std: float
    min: float
    max: float
    n: int
    calls_per_sample: int = 1


class EvaluationResult(BaseModel):
    """Verdict on one candidate."""

    status: EvaluationStatus
    compiled: bool = Field(description="The candidate module imported and `ModelNew` was built.")
    correct: bool
    speedup: float | None = Field(
        None, description="Reference median / candidate median; null unless correct and timed."
    )
    reference_ms: TimingStats | None = None
    candidate_ms: TimingStats | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    flags: list[str] = Field(default_factory=list, description="Hack checks that fired, e.g. `uses_reference_model`.")
    message: str = Field("", description="Compiler error, traceback or reason, truncated.")
    device: str = Field("", description="Device the evaluation ran on, e.g. `cpu` or `cuda:0 (NVIDIA H100)`.")
    torch_version: str = ""
    cache_hit: bool = Field(False, description="A compiled extension was reused from the build cache.")
    build_path: BuildPath | None = Field(
        None,
        description=(
            "How the candidate's extensions were built, by the service's own record: `whole` (load_inline's build), "
            "`split` (the split CUDA build, and its verdict stood), `fallback` (a split was tried and a whole build "
            "decided: the split failed to compile, or the split-built candidate failed and was evaluated again "
            "built whole). Null when nothing was built (PyTorch or Triton candidates)."
        ),
    )
    duration_s: float = Field(0.0, description="Wall-clock time of the whole evaluation.")
    seed: int | None = Field(None, description="Seed the inputs were drawn with.")
    phases_s: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "Where the time went, in seconds: `queued` (waiting for a worker slot), `reference` (0 when cached), "
            "`startup` (taking a ready worker, handing over inputs), `build` (importing the candidate, compiling "
            "included), `correctness`, `compare`, `timing`, and `device_wait` (part of the last ones spent waiting "
            "for the GPU). Inside `build`, the parts of each extension build as the builder timed them: "
            "`build_whole`, `build_split_plan`, `build_split_device`, `build_split_host`, `build_split_stub`, "
            "`build_split_binding`, `build_split_link` (split parts overlap: they compile in parallel), "
            "`build_split_discarded` (a split thrown away for the whole build). `split_run`: the split-built run "
            "that a whole rebuild replaced. Phases a run did not reach are absent."
        ),
    )


class EvaluateBatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[EvaluateRequest] = Field(min_length=1, max_length=MAX_BATCH_SIZE)


class EvaluateBatchResponse(BaseModel):
    results: list[EvaluationResult] = Field(description="One result per item, in request order.")


JobState = Literal["queued", "running", "done", "failed"]


class EvaluationJob(BaseModel):
    """A queued evaluation (`POST /evaluations`, then `GET /evaluations/{id}`)."""

    id: str
    state: JobState
    created_at: float = Field(description="Unix time the job was queued.")
    finished_at: float | None = None
    result: EvaluationResult | None = None
    error: str | None = Field(None, description="Why a `failed` job has no result.")
