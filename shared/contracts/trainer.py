"""Wire contract of the trainer's optional status endpoint (`GET /status`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class TrainerStatus(BaseModel):
    state: Literal["starting", "training", "finished", "failed"]
    update: int = Field(description="Updates completed so far.")
    total_updates: int
    run_dir: str = Field(description="Output directory of the run.")
    last_metrics: dict[str, Any] = Field(default_factory=dict, description="The last line written to metrics.jsonl.")
