"""Plumbing common to the service clients: auth header, bounded retries (tenacity), typed errors."""

from __future__ import annotations

from typing import Any, Self

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

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


class _RetryableStatus(Exception):
    """A RETRY_STATUSES answer, raised inside the retry loop so that tenacity retries it."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response


# 0.5 s, 1 s, 2 s, ... capped at 8 s between attempts; tests replace it with tenacity.wait_none().
RETRY_WAIT: Any = wait_exponential(multiplier=0.5, max=8.0)


def retry_policy(retries: int) -> dict[str, Any]:
    """The one retry policy of the clients: connection errors and RETRY_STATUSES, `retries` extra attempts."""
    return {
        "stop": stop_after_attempt(retries + 1),
        "wait": RETRY_WAIT,
        "retry": retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
        "reraise": True,
    }


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code in RETRY_STATUSES:
        raise _RetryableStatus(response)
    return response


def _result(url: str, response: httpx.Response) -> Any:
    if response.is_error:
        raise ServiceError(url, response.status_code, _detail(response))
    return response.json()


class SyncServiceClient:
    """Blocking client; `request` retries connection errors and RETRY_STATUSES with exponential backoff."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 600.0, retries: int = 2) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.base_url, headers=auth_headers(token), timeout=timeout_s)

    def request(self, method: str, path: str, json: Any = None) -> Any:
        try:
            for attempt in Retrying(**retry_policy(self.retries)):
                with attempt:
                    response = _checked(self._http.request(method, path, json=json))
        except httpx.TransportError as exc:
            raise ServiceError(self.base_url + path, None, repr(exc)) from exc
        except _RetryableStatus as exc:  # still overloaded after the last attempt
            response = exc.response
        return _result(self.base_url + path, response)

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
        try:
            async for attempt in AsyncRetrying(**retry_policy(self.retries)):
                with attempt:
                    response = _checked(await self._http.request(method, path, json=json))
        except httpx.TransportError as exc:
            raise ServiceError(self.base_url + path, None, repr(exc)) from exc
        except _RetryableStatus as exc:
            response = exc.response
        return _result(self.base_url + path, response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
