"""Wire contract of the implementer service (`/implement`).

Sources larger than `shared.contracts.evaluator.MAX_SOURCE_BYTES` are refused with HTTP 413 by the service.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Longest suggestion accepted; the suggester writes at most a few hundred tokens.
MAX_SUGGESTION_CHARS = 8_000

Target = Literal["cuda", "triton", "torch"]
ImplementStatus = Literal["ok", "no_code", "invalid_code", "upstream_error", "refused"]


class ImplementRequest(BaseModel):
    """Turn kernel B plus one suggestion into a new candidate kernel C."""

    model_config = ConfigDict(extra="forbid")

    reference_source: str = Field(min_length=1, description="The problem: KernelBench reference module (`Model`).")
    current_source: str = Field(
        min_length=1,
        description="Kernel B: the current candidate (`ModelNew`), or the reference itself at the first turn.",
    )
    suggestion: str = Field(
        min_length=1,
        max_length=MAX_SUGGESTION_CHARS,
        description="One optimization suggestion, in prose.",
        examples=["Fuse the element-wise chain into one generated kernel."],
    )
    target: Target = Field(
        "cuda", description="What the new kernel may use: CUDA via load_inline, Triton, or PyTorch only."
    )
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature; backend default when absent."
    )
    max_tokens: int | None = Field(
        None, ge=1, le=32_768, description="Reply length limit; backend default when absent."
    )
    return_raw: bool = Field(False, description="Include the backend's raw reply text in the response.")

    @field_validator("suggestion")
    @classmethod
    def _suggestion_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("suggestion is blank")
        return value


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ImplementResponse(BaseModel):
    """The new candidate, or why there is none.

    `upstream_error` means the backend (the LLM server) failed: it says nothing about the suggestion, and the
    trainer keeps such samples out of the loss.
    """

    status: ImplementStatus
    source: str | None = Field(
        None, description="Full KernelBench module defining `ModelNew`; set when status is `ok`."
    )
    backend: str = Field(description="Backend that answered, e.g. `openai` or `builtin`.")
    model: str = Field("", description="Model name the backend used.")
    latency_ms: float = 0.0
    usage: TokenUsage = Field(default_factory=TokenUsage)
    attempts: int = Field(1, description="Backend calls made, repairs and retries included.")
    message: str = Field("", description="Validation error, upstream error or a note (e.g. suggestion not recognised).")
    techniques: list[str] = Field(default_factory=list, description="Techniques the builtin backend applied.")
    raw_reply: str | None = Field(None, description="The backend's raw reply, when `return_raw` was set.")
