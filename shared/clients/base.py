"""Plumbing common to the service clients: auth header, bounded retries, typed errors."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Self

import httpx

# Statuses worth retrying: the server is overloaded or restarting, not refusing the request.
RETRY_STATUSES = frozenset({429, 502, 503, 504})


class ServiceError(RuntimeError):
    """The service answered with an error status, or could not be reached after the retries."""

    def __init__(self, url: str, status_code: int | None, detail: str) -> None:
        self.url = url
        self.status_code = status_code
        self.detail = detail
        where = f"HTTP {status_code}" if status_code is not None else "unreachable"
        super().__init__(f"{url}: {where}: {detail}")


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)


def _backoff_s(attempt: int) -> float:
    return min(0.5 * 2**attempt, 8.0)


class SyncServiceClient:
    """Blocking client; `request` retries connection errors and RETRY_STATUSES with exponential backoff."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 600.0, retries: int = 2) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.base_url, headers=auth_headers(token), timeout=timeout_s)

    def request(self, method: str, path: str, json: Any = None) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, json=json)
            except httpx.TransportError as exc:
                if last:
                    raise ServiceError(self.base_url + path, None, repr(exc)) from exc
                time.sleep(_backoff_s(attempt))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(_backoff_s(attempt))
                continue
            if response.is_error:
                raise ServiceError(self.base_url + path, response.status_code, _detail(response))
            return response.json()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncServiceClient:
    """Asyncio twin of SyncServiceClient."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 600.0, retries: int = 2) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=auth_headers(token), timeout=timeout_s)

    async def request(self, method: str, path: str, json: Any = None) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await self._http.request(method, path, json=json)
            except httpx.TransportError as exc:
                if last:
                    raise ServiceError(self.base_url + path, None, repr(exc)) from exc
                await asyncio.sleep(_backoff_s(attempt))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                await asyncio.sleep(_backoff_s(attempt))
                continue
            if response.is_error:
                raise ServiceError(self.base_url + path, response.status_code, _detail(response))
            return response.json()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
