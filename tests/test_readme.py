"""The README's HTTP examples work as written: each `curl ... -d '{...}'` body is posted to the real service."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from shared.contracts import EvaluateRequest
from tests.servers import REPO

CURL = re.compile(r"curl -s http://127\.0\.0\.1:(\d+)(/\w+) -H '[^']*' -d '(\{.*?\})'", re.DOTALL)


def readme_requests() -> list[tuple[str, str, dict[str, object]]]:
    text = (REPO / "README.md").read_text()
    return [(port, path, json.loads(body)) for port, path, body in CURL.findall(text)]


def test_readme_has_both_examples():
    assert [(port, path) for port, path, _ in readme_requests()] == [("8001", "/evaluate"), ("8002", "/implement")]


def test_evaluate_example_is_a_valid_request():
    (body,) = [body for _, path, body in readme_requests() if path == "/evaluate"]
    EvaluateRequest.model_validate(body)


def test_implement_example_against_the_builtin_implementer():
    from services.implementer.app import create_app
    from services.implementer.config import Settings

    (body,) = [body for _, path, body in readme_requests() if path == "/implement"]
    with TestClient(create_app(Settings(backend="builtin"))) as client:
        reply = client.post("/implement", json=body)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert result["status"] == "ok", result
    assert result["techniques"] == ["fused_library_calls"] and "F.softmax(x, dim=-1)" in result["source"]


@pytest.mark.parametrize("command", ["score", "batch", "problems", "train"])
def test_readme_commands_name_real_subcommands(command: str):
    assert f"kernel-agent {command}" in (REPO / "README.md").read_text()
