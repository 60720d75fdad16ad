"""The openai backend, through the real service, against a real OpenAI-compatible server (llama.cpp + SmolLM2-135M).

A recording proxy sits between the implementer and llama.cpp so the test sees exactly what was sent.
"""

from __future__ import annotations

import httpx

from services.implementer.extract import extract, validate
from services.implementer.prompts import SYSTEM_PROMPT
from shared.clients import ImplementerClient
from shared.contracts import ImplementRequest
from tests.implementer.conftest import LLAMA_MODEL_ALIAS, service_env
from tests.implementer.upstream import RecordingProxy, serve
from tests.servers import run_service

REFERENCE = (
    "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
    "        super().__init__()\n\n    def forward(self, x):\n        x = x * 2.0\n        return torch.relu(x)\n\n\n"
    "def get_inputs():\n    return [torch.randn(64, 256)]\n\n\ndef get_init_inputs():\n    return []\n"
)
SUGGESTION = "Fuse the multiply and the ReLU into a single CUDA kernel written with load_inline."


def test_real_server_round_trip_is_honest(llama_server: str) -> None:
    with serve(RecordingProxy, upstream=llama_server) as (proxy_url, seen):
        env = service_env(
            IMPLEMENTER_BACKEND="openai",
            OPENAI_BASE_URL=proxy_url,
            OPENAI_API_KEY="local-test",
            IMPLEMENTER_MODEL=LLAMA_MODEL_ALIAS,
            IMPLEMENTER_MAX_TOKENS="256",
            IMPLEMENTER_REQUEST_TIMEOUT_S="300",
            IMPLEMENTER_RETRIES="1",
        )
        with run_service("implementer", env=env) as url, ImplementerClient(url, timeout_s=900) as client:
            health = client.health()
            response = client.implement(
                ImplementRequest(
                    reference_source=REFERENCE, current_source=REFERENCE, suggestion=SUGGESTION, return_raw=True
                )
            )
            metrics = httpx.get(f"{url}/metrics").text
    assert health.details["backend"] == "openai" and health.details["model"] == LLAMA_MODEL_ALIAS
    # The request carried the contract, the reference, the current kernel and the suggestion.
    first = seen.bodies[0]
    assert first["model"] == LLAMA_MODEL_ALIAS and first["temperature"] == 0 and first["max_tokens"] == 256
    assert first["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    user = first["messages"][1]["content"]
    assert SUGGESTION in user and user.count("def forward(self, x):") == 2 and "load_inline" in user
    # Extraction and validation ran on the real reply, and the status says what they found.
    assert response.backend == "openai" and response.model == LLAMA_MODEL_ALIAS
    assert response.status in ("ok", "no_code", "invalid_code", "refused"), response.message
    assert response.attempts == len(seen.bodies) in (1, 2)
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0
    assert response.raw_reply
    final_reply = response.raw_reply.split("\n\n--- repair reply ---\n\n")[-1]
    assert extract(final_reply).status == response.status
    if response.status == "ok":
        assert response.source and validate(response.source) is None
    else:
        assert response.source is None and response.message
    if len(seen.bodies) == 2:  # the first reply was unusable: one repair round carrying the reason
        repair = seen.bodies[1]["messages"]
        assert repair[2]["role"] == "assistant" and "could not be used" in repair[3]["content"]
    assert 'implementer_requests_total{backend="openai",status="' + response.status + '"} 1.0' in metrics
