"""Backend for any OpenAI-compatible chat server: GPT-4o by default; vLLM, SGLang, llama.cpp or Ollama via base URL."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai
from cachetools import LRUCache
from openai.types.chat import ChatCompletionMessageParam
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential

from services.implementer.config import Settings
from services.implementer.extract import Extraction, extract
from services.implementer.prompts import build_messages, repair_messages
from shared.contracts import ImplementRequest, ImplementResponse, TokenUsage

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class UpstreamFailure(Exception):
    """The server could not give a reply after the retries (or refused the request outright)."""


@dataclass
class CallLog:
    """What one /implement request cost upstream."""

    calls: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    replies: list[str] = field(default_factory=list)

    def add_usage(self, usage: TokenUsage) -> None:
        self.usage = TokenUsage(
            prompt_tokens=self.usage.prompt_tokens + usage.prompt_tokens,
            completion_tokens=self.usage.completion_tokens + usage.completion_tokens,
            total_tokens=self.usage.total_tokens + usage.total_tokens,
        )


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    return isinstance(exc, openai.APIStatusError) and (exc.status_code == 429 or exc.status_code >= 500)


def _reason(exc: Exception) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"[:500]
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return f"connection failed: {cause!r}"[:500]
    return repr(exc)[:500]


class OpenAICompatBackend:
    """Chat completion with own retry loop (so attempts are counted), a concurrency limit and an LRU reply cache."""

    name = "openai"

    def __init__(self, settings: Settings) -> None:
        settings.check()
        self.settings = settings
        self.model = settings.model
        self._client = openai.AsyncOpenAI(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key or "unused",
            timeout=settings.request_timeout_s,
            max_retries=0,
        )
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._cache: LRUCache[str, tuple[str, TokenUsage]] = LRUCache(maxsize=max(self.settings.cache_size, 1))

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAICompatBackend:
        return cls(settings)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model,
            "base_url": self.settings.openai_base_url,
            "max_concurrency": self.settings.max_concurrency,
            "cached_replies": len(self._cache),
        }

    async def aclose(self) -> None:
        await self._client.close()

    async def implement(self, request: ImplementRequest) -> ImplementResponse:
        started = time.perf_counter()
        temperature = self.settings.temperature if request.temperature is None else request.temperature
        max_tokens = request.max_tokens or self.settings.max_tokens
        messages = build_messages(
            reference_source=request.reference_source,
            current_source=request.current_source,
            suggestion=request.suggestion,
            target=request.target,
        )
        calls = CallLog()
        try:
            result = await self._complete_and_extract(messages, temperature, max_tokens, calls)
        except UpstreamFailure as exc:
            result = None
            message = str(exc)
        if result is None:
            status, source = "upstream_error", None
        else:
            status, source, message = result.status, result.source if result.status == "ok" else None, result.message
        return ImplementResponse(
            status=status,
            source=source,
            backend=self.name,
            model=self.model,
            latency_ms=(time.perf_counter() - started) * 1000,
            usage=calls.usage,
            attempts=calls.calls,
            message=message,
            raw_reply="\n\n--- repair reply ---\n\n".join(calls.replies)
            if request.return_raw and calls.replies
            else None,
        )

    async def _complete_and_extract(
        self, messages: list[ChatCompletionMessageParam], temperature: float, max_tokens: int, calls: CallLog
    ) -> Extraction:
        reply = await self._complete(messages, temperature, max_tokens, calls)
        first = extract(reply)
        if first.status not in ("no_code", "invalid_code"):
            return first
        log.info("reply unusable (%s: %s); asking for one repair", first.status, first.message)
        repaired = extract(
            await self._complete(repair_messages(messages, reply, first.message), temperature, max_tokens, calls)
        )
        if repaired.status == "ok":
            return repaired
        return Extraction(
            repaired.status,
            repaired.source,
            f"{repaired.message} (after one repair round; first reply: {first.message})",
        )

    async def _complete(
        self, messages: list[ChatCompletionMessageParam], temperature: float, max_tokens: int, calls: CallLog
    ) -> str:
        key = json.dumps([self.model, messages, temperature, max_tokens])
        cached = self._cache.get(key)  # a hit becomes the most recently used entry
        if cached is not None:
            text, _ = cached
            calls.replies.append(text)
            return text
        text, usage = await self._call_with_retries(messages, temperature, max_tokens, calls)
        calls.add_usage(usage)
        calls.replies.append(text)
        if self.settings.cache_size:
            self._cache[key] = (text, usage)  # the least recently used entry goes when it is full
        return text

    async def _call_with_retries(
        self, messages: list[ChatCompletionMessageParam], temperature: float, max_tokens: int, calls: CallLog
    ) -> tuple[str, TokenUsage]:
        """The SDK's own retries stay off (max_retries=0): tenacity retries here, so that every attempt is counted
        in the response and a failure after the last one is a typed UpstreamFailure."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.retries + 1),
            wait=wait_exponential(multiplier=self.settings.backoff_s, max=MAX_BACKOFF_S),
            retry=retry_if_exception(_retryable),
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    calls.calls += 1
                    async with self._limit:
                        completion = await self._client.chat.completions.create(
                            model=self.model, messages=messages, temperature=temperature, max_tokens=max_tokens
                        )
        except (openai.APIConnectionError, openai.APIStatusError) as exc:
            if not _retryable(exc):
                raise UpstreamFailure(f"upstream refused the request: {_reason(exc)}") from exc
            raise UpstreamFailure(f"upstream failed after {calls.calls} attempts: {_reason(exc)}") from exc
        return _reply_text(completion), _usage(completion)


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    delay = state.next_action.sleep if state.next_action else 0.0
    reason = _reason(exc) if isinstance(exc, Exception) else "unknown"
    log.warning("upstream call failed (%s); retry %d in %.1f s", reason, state.attempt_number, delay)


def _reply_text(completion: Any) -> str:
    choices = getattr(completion, "choices", None) or []
    if not choices or choices[0].message is None:
        raise UpstreamFailure("upstream reply has no choices")
    message = choices[0].message
    return message.content or getattr(message, "refusal", None) or ""


def _usage(completion: Any) -> TokenUsage:
    usage = getattr(completion, "usage", None)
    if usage is None:
        return TokenUsage()
    return TokenUsage(
        prompt_tokens=usage.prompt_tokens or 0,
        completion_tokens=usage.completion_tokens or 0,
        total_tokens=usage.total_tokens or 0,
    )
