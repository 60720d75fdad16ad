"""HTTP surface of the implementer: status codes, auth, health, metrics, start-up checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from services.implementer.app import create_app
from services.implementer.config import Settings
from shared.contracts import MAX_SOURCE_BYTES
from tests.servers import REPO

SOURCE = (
    "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
    "        return torch.sigmoid(x * 2.0) + 1.0\n"
)


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app(Settings(backend="builtin")))


def body(**overrides: object) -> dict[str, object]:
    return {"reference_source": SOURCE, "current_source": SOURCE, "suggestion": "Use torch.compile.", **overrides}


def test_implement_and_health(client: TestClient) -> None:
    response = client.post("/implement", json=body())
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "ok" and data["techniques"] == ["torch_compile"] and "class ModelNew" in data["source"]
    health = client.get("/health").json()
    assert health["service"] == "implementer" and health["details"]["backend"] == "builtin"
    assert health["details"]["model"] == "builtin-rules-v1" and "fuse_elementwise" in health["details"]["techniques"]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"suggestion": ""}, "at least 1 character"),
        ({"suggestion": "   \n"}, "suggestion is blank"),
        ({"suggestion": 42}, "valid string"),
        ({"suggestion": ["fuse"]}, "valid string"),
        ({"target": "metal"}, "'cuda', 'triton' or 'torch'"),
        ({"current_source": None}, "valid string"),
        ({"temperature": 5}, "less than or equal to 2"),
        ({"unexpected": 1}, "Extra inputs"),
    ],
)
def test_bad_input_is_422_with_reason(client: TestClient, overrides: dict, reason: str) -> None:
    response = client.post("/implement", json=body(**overrides))
    assert response.status_code == 422
    assert reason in str(response.json()["detail"])


def test_non_json_body_is_422(client: TestClient) -> None:
    response = client.post("/implement", content=b"not json", headers={"content-type": "application/json"})
    assert response.status_code == 422


@pytest.mark.parametrize("field", ["reference_source", "current_source"])
def test_oversized_source_is_413(client: TestClient, field: str) -> None:
    big = SOURCE + "#" * (MAX_SOURCE_BYTES + 1)
    response = client.post("/implement", json=body(**{field: big}))
    assert response.status_code == 413
    assert field in response.json()["detail"] and str(MAX_SOURCE_BYTES) in response.json()["detail"]


def test_unparsable_current_kernel_is_reported_not_500(client: TestClient) -> None:
    response = client.post("/implement", json=body(current_source="def broken(:\n"))
    assert response.status_code == 200
    assert response.json()["status"] == "invalid_code" and "does not parse" in response.json()["message"]


def test_token_protects_everything_but_health() -> None:
    client = TestClient(create_app(Settings(backend="builtin", token="s3cret")))
    assert client.get("/health").status_code == 200
    assert client.post("/implement", json=body()).status_code == 401
    assert client.get("/metrics").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert client.post("/implement", json=body(), headers=wrong).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    assert client.post("/implement", json=body(), headers=good).status_code == 200
    assert client.get("/metrics", headers=good).status_code == 200


def test_metrics_count_requests_by_status(client: TestClient) -> None:
    client.post("/implement", json=body())
    client.post("/implement", json=body(current_source="nothing here = 1"))
    text = client.get("/metrics").text
    assert 'implementer_requests_total{backend="builtin",status="ok"} 1.0' in text
    assert 'implementer_requests_total{backend="builtin",status="invalid_code"} 1.0' in text
    assert "implementer_latency_seconds_bucket" in text and "implementer_tokens_total" in text


def _start(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("IMPLEMENTER_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "services.implementer", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,  # start-up imports on a loaded 2-core CI machine have taken over 60 s
        env={**clean, "PYTHONPATH": os.pathsep.join(sys.path), **env},
    )


def test_missing_api_key_stops_start_up_naming_the_fix() -> None:
    result = _start(["--port", "1"], {"IMPLEMENTER_BACKEND": "openai"})
    assert result.returncode == 2
    assert "OPENAI_API_KEY" in result.stderr and "IMPLEMENTER_BACKEND=builtin" in result.stderr


def test_non_loopback_bind_needs_a_token() -> None:
    result = _start(["--host", "0.0.0.0", "--port", "1"], {"IMPLEMENTER_BACKEND": "builtin"})
    assert result.returncode == 2 and "IMPLEMENTER_TOKEN" in result.stderr
