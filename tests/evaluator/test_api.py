"""HTTP surface without running kernels: limits, validation, auth, health, metrics, docs (TestClient)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.evaluator.app import create_app
from services.evaluator.config import Settings
from shared.contracts import MAX_SOURCE_BYTES
from tests.evaluator import sources
from tests.servers import REPO

TOKEN = "test-token-123"


def make_client(tmp_path: Path, **overrides: object) -> TestClient:
    settings = Settings(cache_dir=tmp_path / "cache", prespawn=False, workers=1, **overrides)
    return TestClient(create_app(settings))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as client:
        yield client


def body(**fields: object) -> dict[str, object]:
    return {"reference_source": sources.REFERENCE, "candidate_source": sources.CORRECT, **fields}


def test_oversized_source_is_413(api: TestClient) -> None:
    big = "# " + "x" * MAX_SOURCE_BYTES
    response = api.post("/evaluate", json=body(candidate_source=big))
    assert response.status_code == 413 and "limit" in response.json()["detail"]


def test_oversized_body_is_413_before_parsing(api: TestClient) -> None:
    response = api.post(
        "/evaluate", content=b"{" + b" " * (8 * MAX_SOURCE_BYTES), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("content", "codes"),
    [
        (b"{not json", (400, 422)),
        (json.dumps({"candidate_source": "x"}).encode(), (422,)),
        (b'{"reference_source": "\xff\xfe", "candidate_source": "x"}', (400, 422)),
        (json.dumps(body(candidate_source="\ud800")).encode(), (400,)),
        (json.dumps(body(correctness_trials=0)).encode(), (422,)),
        (json.dumps(body(surprise=1)).encode(), (422,)),
    ],
)
def test_malformed_requests_are_4xx(api: TestClient, content: bytes, codes: tuple[int, ...]) -> None:
    response = api.post("/evaluate", content=content, headers={"content-type": "application/json"})
    assert response.status_code in codes, response.text
    assert "detail" in response.json() and "Traceback" not in response.text


@pytest.mark.parametrize(
    "fields",
    [
        {"atol": float("nan")},
        {"atol": float("inf")},
        {"rtol": float("inf")},
        {"rtol": float("nan")},
        {"timeout_s": float("nan")},
        {"timeout_s": float("inf")},
    ],
)
def test_non_finite_floats_are_422(api: TestClient, fields: dict[str, float]) -> None:
    content = json.dumps(body(**fields))  # json.dumps writes NaN / Infinity, which Python's json.loads accepts
    assert "NaN" in content or "Infinity" in content
    response = api.post("/evaluate", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "finite" in response.text


@pytest.mark.parametrize(
    ("reference", "missing"),
    [
        (sources.REFERENCE.replace("class Model(", "class Other("), "Model"),
        (sources.REFERENCE.replace("def get_inputs", "def inputs"), "get_inputs"),
        (sources.REFERENCE.replace("def get_init_inputs", "def init_inputs"), "get_init_inputs"),
        ("def broken(:\n", "syntax error"),
    ],
)
def test_reference_without_kernelbench_names_is_422(api: TestClient, reference: str, missing: str) -> None:
    response = api.post("/evaluate", json=body(reference_source=reference))
    assert response.status_code == 422 and missing in response.json()["detail"]


def test_cuda_without_gpu_is_422(api: TestClient) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    response = api.post("/evaluate", json=body(device="cuda"))
    assert response.status_code == 422 and "cuda" in response.json()["detail"]


def test_candidate_without_model_new_is_a_verdict(api: TestClient) -> None:
    response = api.post("/evaluate", json=body(candidate_source=sources.NO_MODEL_NEW))
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "compile_error" and not result["compiled"] and "ModelNew" in result["message"]


def test_static_rejection_needs_no_worker(api: TestClient) -> None:
    result = api.post("/evaluate", json=body(candidate_source=sources.IMPORT_REFERENCE)).json()
    assert result["status"] == "rejected" and result["flags"] == ["uses_reference_model"]
    custom = api.post("/evaluate", json=body(require_custom_kernel=True)).json()
    assert custom["status"] == "rejected" and "no_custom_kernel" in custom["flags"]


def test_token_guards_every_route_but_health(tmp_path: Path) -> None:
    with make_client(tmp_path, token=TOKEN) as client:
        assert client.get("/health").status_code == 200
        for method, path in [
            ("post", "/evaluate"),
            ("post", "/evaluate/batch"),
            ("post", "/evaluations"),
            ("get", "/evaluations/x"),
            ("get", "/metrics"),
            ("get", "/docs"),
            ("get", "/openapi.json"),
        ]:
            assert getattr(client, method)(path).status_code == 401, path
            wrong = getattr(client, method)(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/openapi.json", headers=auth).status_code == 200
        result = client.post("/evaluate", json=body(candidate_source=sources.SYNTAX_ERROR), headers=auth)
        assert result.status_code == 200 and result.json()["status"] == "compile_error"


def test_health_metrics_and_docs(api: TestClient) -> None:
    health = api.get("/health").json()
    assert health["service"] == "evaluator" and health["details"]["isolation"] in ("process", "strict")
    assert "cpu" in health["details"]["devices"]
    api.post("/evaluate", json=body(candidate_source=sources.SYNTAX_ERROR))
    metrics = api.get("/metrics").text
    assert 'evaluator_verdicts_total{status="compile_error"} 1.0' in metrics
    assert 'evaluator_requests_total{code="200",route="/evaluate"}' in metrics
    assert "evaluator_queue_depth 0.0" in metrics and "evaluator_evaluation_seconds_bucket" in metrics
    assert api.get("/docs").status_code == 200
    assert "/evaluate/batch" in api.get("/openapi.json").json()["paths"]


def test_refuses_public_bind_without_token() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.evaluator", "--host", "0.0.0.0", "--port", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert done.returncode != 0 and "EVALUATOR_TOKEN" in done.stderr


@pytest.mark.parametrize("field", ["correctness_trials", "seed", "unknown_field"])
def test_non_finite_number_in_any_field_is_422(api: TestClient, field: str) -> None:
    content = json.dumps(body(**{field: float("nan")}))
    response = api.post("/evaluate", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "nan" in response.text.lower()
