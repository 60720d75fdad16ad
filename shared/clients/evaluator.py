"""httpx clients of the evaluator service."""

from __future__ import annotations

from shared.clients.base import AsyncServiceClient, SyncServiceClient
from shared.contracts import (
    EvaluateBatchRequest,
    EvaluateBatchResponse,
    EvaluateRequest,
    EvaluationJob,
    EvaluationResult,
    HealthResponse,
)


class EvaluatorClient(SyncServiceClient):
    def evaluate(self, request: EvaluateRequest) -> EvaluationResult:
        return EvaluationResult.model_validate(self.request("POST", "/evaluate", request.model_dump(mode="json")))

    def evaluate_batch(self, requests: list[EvaluateRequest]) -> list[EvaluationResult]:
        body = EvaluateBatchRequest(items=requests).model_dump(mode="json")
        return EvaluateBatchResponse.model_validate(self.request("POST", "/evaluate/batch", body)).results

    def submit(self, request: EvaluateRequest) -> EvaluationJob:
        return EvaluationJob.model_validate(self.request("POST", "/evaluations", request.model_dump(mode="json")))

    def job(self, job_id: str) -> EvaluationJob:
        return EvaluationJob.model_validate(self.request("GET", f"/evaluations/{job_id}"))

    def health(self) -> HealthResponse:
        return HealthResponse.model_validate(self.request("GET", "/health"))


class AsyncEvaluatorClient(AsyncServiceClient):
    async def evaluate(self, request: EvaluateRequest) -> EvaluationResult:
        return EvaluationResult.model_validate(await self.request("POST", "/evaluate", request.model_dump(mode="json")))

    async def evaluate_batch(self, requests: list[EvaluateRequest]) -> list[EvaluationResult]:
        body = EvaluateBatchRequest(items=requests).model_dump(mode="json")
        return EvaluateBatchResponse.model_validate(await self.request("POST", "/evaluate/batch", body)).results

    async def submit(self, request: EvaluateRequest) -> EvaluationJob:
        return EvaluationJob.model_validate(await self.request("POST", "/evaluations", request.model_dump(mode="json")))

    async def job(self, job_id: str) -> EvaluationJob:
        return EvaluationJob.model_validate(await self.request("GET", f"/evaluations/{job_id}"))

    async def health(self) -> HealthResponse:
        return HealthResponse.model_validate(await self.request("GET", "/health"))
