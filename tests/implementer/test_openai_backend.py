"""The openai backend against real local HTTP servers: scripted replies, failures, slowness, no server at all."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.implementer.backends.openai_compat import OpenAICompatBackend
from services.implementer.config import Settings
from shared.contracts import ImplementRequest
from tests.implementer.upstream import AlwaysFails, ScriptedChat, TooSlow, serve
from tests.servers import free_port

REFERENCE = (
    "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
    "        return torch.relu(x) * 2.0\n\n\ndef get_inputs():\n    return [torch.randn(8)]\n\n\n"
    "def get_init_inputs():\n    return []\n"
)
GOOD = (
    "Here is the kernel.\n```python\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x).mul_(2.0)\n```\n"
)
BROKEN = "```python\nclass ModelNew(nn.Module):\n    def forward(self, x)\n        return x\n```"
NO_CLASS = "```python\nimport torch\n\ndef forward(x):\n    return x\n```"


def backend(url: str, **overrides: object) -> OpenAICompatBackend:
    fields = {
        "backend": "openai",
        "openai_base_url": url,
        "openai_api_key": "test-key",
        "model": "scripted",
        "retries": 2,
        "backoff_s": 0.05,
        "request_timeout_s": 5.0,
        **overrides,
    }
    return OpenAICompatBackend(Settings(**fields))


def request(**overrides: object) -> ImplementRequest:
    fields = {
        "reference_source": REFERENCE,
        "current_source": REFERENCE,
        "suggestion": "Do the scaling in place.",
        "max_tokens": 64,
        **overrides,
    }
    return ImplementRequest(**fields)


def run(coro):  # noqa: ANN001, ANN201 - tiny helper
    return asyncio.run(coro)


def test_valid_reply_is_extracted_and_usage_reported() -> None:
    with serve(ScriptedChat, replies=[GOOD]) as (url, seen):
        response = run(backend(url).implement(request(return_raw=True)))
    assert response.status == "ok", response.message
    assert response.source is not None and "class ModelNew" in response.source and "Here is" not in response.source
    assert response.attempts == 1 and len(seen.bodies) == 1
    assert response.usage.total_tokens == 18 and response.raw_reply == GOOD
    sent = seen.bodies[0]
    assert sent["model"] == "scripted" and sent["temperature"] == 0 and sent["max_tokens"] == 64
    assert "ModelNew" in sent["messages"][0]["content"] and "Do the scaling in place." in sent["messages"][1]["content"]


def test_invalid_code_gets_one_repair_round_with_the_error() -> None:
    with serve(ScriptedChat, replies=[BROKEN, GOOD]) as (url, seen):
        response = run(backend(url).implement(request()))
    assert response.status == "ok" and response.attempts == 2
    repair = seen.bodies[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": BROKEN}
    assert "SyntaxError" in repair[-1]["content"]


@pytest.mark.parametrize(
    ("replies", "status"), [([BROKEN, NO_CLASS], "invalid_code"), (["Sure, just use relu.", "no"], "no_code")]
)
def test_still_unusable_after_repair_is_reported_honestly(replies: list[str], status: str) -> None:
    with serve(ScriptedChat, replies=replies) as (url, seen):
        response = run(backend(url).implement(request()))
    assert response.status == status and response.source is None
    assert response.attempts == 2 == len(seen.bodies)
    assert "after one repair round" in response.message


def test_refusal_is_not_repaired() -> None:
    with serve(ScriptedChat, replies=["I'm sorry, I can't help with that."]) as (url, seen):
        response = run(backend(url).implement(request()))
    assert response.status == "refused" and response.attempts == 1 == len(seen.bodies)


def test_rate_limit_then_success_is_retried() -> None:
    with serve(ScriptedChat, replies=[429, 503, GOOD]) as (url, seen):
        response = run(backend(url).implement(request()))
    assert response.status == "ok" and response.attempts == 3 == len(seen.bodies)


def test_server_error_gives_upstream_error_after_retries() -> None:
    with serve(AlwaysFails) as (url, seen):
        response = run(backend(url, retries=2).implement(request()))
    assert response.status == "upstream_error" and response.source is None
    assert response.attempts == 3 == len(seen.bodies)
    assert "HTTP 500" in response.message


def test_client_error_is_not_retried() -> None:
    with serve(AlwaysFails, status=404) as (url, seen):
        response = run(backend(url, retries=3).implement(request()))
    assert response.status == "upstream_error" and response.attempts == 1 == len(seen.bodies)
    assert "HTTP 404" in response.message


def test_slow_server_times_out_after_retries() -> None:
    with serve(TooSlow, delay_s=3.0) as (url, seen):
        started = time.monotonic()
        response = run(backend(url, retries=1, request_timeout_s=0.5).implement(request()))
        # Measured before the server shuts down (which waits for its 3 s handlers): two 0.5 s timeouts and a backoff.
        elapsed = time.monotonic() - started
    assert response.status == "upstream_error" and "timed out" in response.message
    assert response.attempts == 2 == len(seen.bodies)
    assert elapsed < 3.0


def test_unreachable_server_gives_upstream_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    response = run(backend(url, retries=2).implement(request()))
    assert response.status == "upstream_error" and response.attempts == 3
    assert "connection failed" in response.message


def test_identical_requests_are_served_from_the_cache() -> None:
    with serve(ScriptedChat, replies=[GOOD]) as (url, seen):
        impl = backend(url)
        first = run(impl.implement(request()))
        second = run(impl.implement(request()))
        third = run(impl.implement(request(temperature=0.7)))
    assert first.status == second.status == third.status == "ok"
    assert (first.attempts, second.attempts, third.attempts) == (1, 0, 1)
    assert len(seen.bodies) == 2 and second.source == first.source


def test_concurrency_limit_holds() -> None:
    with serve(ScriptedChat, replies=[GOOD], delay_s=0.3) as (url, seen):
        impl = backend(url, max_concurrency=2, cache_size=0)

        async def many() -> list:
            return await asyncio.gather(*(impl.implement(request(suggestion=f"variant {i}")) for i in range(5)))

        responses = run(many())
    assert all(r.status == "ok" for r in responses)
    assert seen.max_in_flight == 2 and len(seen.bodies) == 5


def test_missing_key_with_default_url_is_a_start_up_error() -> None:
    with pytest.raises(ValueError, match="OPENAI_API_KEY.*OPENAI_BASE_URL.*IMPLEMENTER_BACKEND=builtin"):
        OpenAICompatBackend(
            Settings(backend="openai", openai_api_key=None, openai_base_url="https://api.openai.com/v1")
        )
