"""The one interface every implementer backend speaks."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from shared.contracts import ImplementRequest, ImplementResponse


@runtime_checkable
class ImplementerBackend(Protocol):
    """Turns (reference, current kernel, suggestion) into a new candidate; never raises for upstream trouble."""

    name: str
    model: str

    async def implement(self, request: ImplementRequest) -> ImplementResponse: ...

    def describe(self) -> dict[str, Any]:
        """Facts for /health (no secrets)."""
        ...

    async def aclose(self) -> None: ...
