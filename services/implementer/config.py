"""Settings of the implementer service (env prefix `IMPLEMENTER_`; OPENAI_BASE_URL / OPENAI_API_KEY also unprefixed)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# The public endpoint: with it, a missing API key is a configuration error, not something to retry.
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"


class Settings(BaseSettings):
    """One field per knob; unsafe combinations are refused at start-up (see `check`)."""

    model_config = SettingsConfigDict(env_prefix="IMPLEMENTER_", extra="ignore", populate_by_name=True)

    backend: Literal["openai", "builtin"] = Field(
        default="openai",
        description="`openai`: any OpenAI-compatible server; `builtin`: the offline rule-based implementer.",
    )
    model: str = Field(default="gpt-4o", description="Model name sent to the OpenAI-compatible server.")
    openai_base_url: str = Field(
        default=DEFAULT_OPENAI_BASE_URL,
        validation_alias=AliasChoices("IMPLEMENTER_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
        description="Base URL of the OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama: their /v1 URL).",
    )
    openai_api_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("IMPLEMENTER_OPENAI_API_KEY", "OPENAI_API_KEY"),
        description="API key; local servers accept any non-empty string.",
    )
    temperature: float = Field(default=0.0, ge=0, le=2, description="Default sampling temperature.")
    max_tokens: int = Field(default=4096, ge=1, le=32_768, description="Default reply length limit.")
    request_timeout_s: float = Field(default=120.0, gt=0, description="Limit of one upstream call.")
    retries: int = Field(default=3, ge=0, le=10, description="Extra attempts after a 429/5xx/connection error/timeout.")
    backoff_s: float = Field(default=1.0, ge=0, description="First retry delay; doubles each retry (capped at 30 s).")
    max_concurrency: int = Field(default=8, ge=1, description="Upstream calls in flight at once.")
    cache_size: int = Field(
        default=1024, ge=0, description="LRU entries of (model, prompt, temperature, max_tokens) -> reply; 0 disables."
    )
    token: str | None = Field(default=None, description="Bearer token required on every route but /health when set.")

    def check(self) -> None:
        """Refuse a configuration that cannot work, naming the fix."""
        if (
            self.backend == "openai"
            and not self.openai_api_key
            and self.openai_base_url.rstrip("/") == DEFAULT_OPENAI_BASE_URL
        ):
            raise ValueError(
                "IMPLEMENTER_BACKEND=openai talks to api.openai.com but OPENAI_API_KEY is not set. Fix: set "
                "OPENAI_API_KEY, or point OPENAI_BASE_URL at another OpenAI-compatible server (vLLM, SGLang, "
                "llama.cpp, Ollama), or run offline with IMPLEMENTER_BACKEND=builtin."
            )
