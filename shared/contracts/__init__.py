"""Pydantic v2 models of every request and response the services exchange. Services import them from here."""

from shared.contracts.common import ErrorResponse, HealthResponse
from shared.contracts.evaluator import (
    MAX_BATCH_SIZE,
    MAX_SOURCE_BYTES,
    BuildPath,
    Device,
    EvaluateBatchRequest,
    EvaluateBatchResponse,
    EvaluateRequest,
    EvaluationJob,
    EvaluationResult,
    EvaluationStatus,
    JobState,
    TimingStats,
)
from shared.contracts.implementer import (
    MAX_SUGGESTION_CHARS,
    ImplementRequest,
    ImplementResponse,
    ImplementStatus,
    Target,
    TokenUsage,
)
from shared.contracts.trainer import TrainerStatus

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_SOURCE_BYTES",
    "MAX_SUGGESTION_CHARS",
    "BuildPath",
    "Device",
    "ErrorResponse",
    "EvaluateBatchRequest",
    "EvaluateBatchResponse",
    "EvaluateRequest",
    "EvaluationJob",
    "EvaluationResult",
    "EvaluationStatus",
    "HealthResponse",
    "ImplementRequest",
    "ImplementResponse",
    "ImplementStatus",
    "JobState",
    "Target",
    "TimingStats",
    "TokenUsage",
    "TrainerStatus",
]
