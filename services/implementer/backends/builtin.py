"""Offline backend: a deterministic rule engine that rewrites the kernel with `ast` (nothing is executed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.implementer.config import Settings
from services.implementer.rules import ORDER, RewriteError, rewrite, vocabulary
from shared.contracts import ImplementRequest, ImplementResponse

MODEL_NAME = "builtin-rules-v1"


class BuiltinBackend:
    name = "builtin"
    model = MODEL_NAME

    @classmethod
    def from_settings(cls, settings: Settings) -> BuiltinBackend:
        return cls()

    def describe(self) -> dict[str, Any]:
        # the vocabulary (name, summary, example, triggers) lets a client such as the trainer describe the techniques
        return {"backend": self.name, "model": self.model, "techniques": list(ORDER), "vocabulary": vocabulary()}

    async def aclose(self) -> None:
        return None

    async def implement(self, request: ImplementRequest) -> ImplementResponse:
        started = time.perf_counter()
        try:
            result = await asyncio.to_thread(rewrite, request.current_source, request.suggestion, request.target)
        except RewriteError as exc:
            return ImplementResponse(
                status="invalid_code",
                backend=self.name,
                model=self.model,
                message=str(exc),
                latency_ms=(time.perf_counter() - started) * 1000,
            )
        if not result.recognised:
            message = "no technique recognised in the suggestion; the kernel is unchanged. Vocabulary: " + ", ".join(
                ORDER
            )
        elif not result.applied:
            message = "recognised but not applied; the kernel is unchanged. " + "; ".join(result.notes)
        else:
            message = "applied: " + ", ".join(result.applied) + ("; " + "; ".join(result.notes) if result.notes else "")
        return ImplementResponse(
            status="ok",
            source=result.source,
            backend=self.name,
            model=self.model,
            techniques=result.applied,
            latency_ms=(time.perf_counter() - started) * 1000,
            message=message,
            raw_reply=result.source if request.return_raw else None,
        )
