"""httpx clients of the implementer service."""

from __future__ import annotations

from shared.clients.base import AsyncServiceClient, SyncServiceClient
from shared.contracts import HealthResponse, ImplementRequest, ImplementResponse


class ImplementerClient(SyncServiceClient):
    def implement(self, request: ImplementRequest) -> ImplementResponse:
        return ImplementResponse.model_validate(self.request("POST", "/implement", request.model_dump(mode="json")))

    def health(self) -> HealthResponse:
        return HealthResponse.model_validate(self.request("GET", "/health"))


class AsyncImplementerClient(AsyncServiceClient):
    async def implement(self, request: ImplementRequest) -> ImplementResponse:
        return ImplementResponse.model_validate(
            await self.request("POST", "/implement", request.model_dump(mode="json"))
        )

    async def health(self) -> HealthResponse:
        return HealthResponse.model_validate(await self.request("GET", "/health"))
