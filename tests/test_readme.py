"""The README's CPU examples work as written: the services are started with its `kernel-agent serve` lines (on free
ports), and each `curl ... -d '{...}'` body is posted to the service that line started."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from services.evaluator.evaluation import MIN_TIMED_BLOCKS
from tests.servers import REPO, free_port, stop, wait_healthy

SERVE = re.compile(
    r"^(?P<env>(?:\w+=\S+ )*)\.venv/bin/kernel-agent serve (?P<service>\w+) --host 127\.0\.0\.1 --port (?P<port>\d+)$",
    re.M,
)
CURL = re.compile(r"curl -s http://127\.0\.0\.1:(\d+)(/\w+) -H '[^']*' -d '(\{.*?\})'", re.DOTALL)


def readme_requests() -> list[tuple[str, str, dict[str, object]]]:
    text = (REPO / "README.md").read_text()
    return [(port, path, json.loads(body)) for port, path, body in CURL.findall(text)]


def test_readme_has_both_examples():
    assert [(port, path) for port, path, _ in readme_requests()] == [("8001", "/evaluate"), ("8002", "/implement")]


def readme_serve_lines() -> dict[str, tuple[dict[str, str], str]]:
    """service -> (environment the line sets, port it names)."""
    text = (REPO / "README.md").read_text()
    return {
        m["service"]: (dict(item.split("=", 1) for item in shlex.split(m["env"])), m["port"])
        for m in SERVE.finditer(text)
    }


@contextlib.contextmanager
def served_as_in_readme(service: str) -> Iterator[str]:
    """The README's `kernel-agent serve <service>` line, run on a free port (the README's port may be in use)."""
    env, _ = readme_serve_lines()[service]
    script = REPO / ".venv/bin/kernel-agent"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]
    port = free_port()
    proc = subprocess.Popen(
        [*command, "serve", service, "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop(proc)


def test_readme_serve_lines_match_the_examples_ports():
    ports = {service: port for service, (_, port) in readme_serve_lines().items()}
    assert ports == {"evaluator": "8001", "implementer": "8002"}
    assert {port for port, _, _ in readme_requests()} == set(ports.values())


def test_evaluate_example_against_the_evaluator_it_starts():
    (body,) = [body for _, path, body in readme_requests() if path == "/evaluate"]
    with served_as_in_readme("evaluator") as url:

        def evaluated() -> dict:
            reply = httpx.post(f"{url}/evaluate", json=body, timeout=600)
            assert reply.status_code == 200, reply.text
            return reply.json()

        result = evaluated()
        if result["status"] == "rejected" and result["flags"] == ["implausible_timing"]:
            # Evaluated once more where the judge took the honest example's slower process for work moved out of
            # its calls (one CI run; none in 8 runs here since workers have huge pages, docs/evaluator.md "Not
            # covered"); a candidate the judge is biased against fails twice in a row, a chance verdict seldom.
            first = f"{result['flags']} {result['message'][-300:]}"
            result = evaluated()
            result["message"] += f"; first: {first}"
    # What the README says the example returns: a correct candidate, timed over at least the calls it asks for.
    assert result["status"] == "correct", f"{result['status']} {result['flags']} {result['message'][-1500:]}"
    timed = result["candidate_ms"]
    assert timed["n"] * timed["calls_per_sample"] >= body["timing_trials"] and timed["n"] >= min(
        MIN_TIMED_BLOCKS, body["timing_trials"]
    ), result
    assert result["speedup"] is not None and result["speedup"] > 0, result


def test_implement_example_against_the_implementer_it_starts():
    (body,) = [body for _, path, body in readme_requests() if path == "/implement"]
    with served_as_in_readme("implementer") as url:
        reply = httpx.post(f"{url}/implement", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert result["status"] == "ok", result
    assert result["techniques"] == ["fused_library_calls"] and "F.softmax(x, dim=-1)" in result["source"]


@pytest.mark.parametrize("command", ["score", "batch", "problems", "train"])
def test_readme_commands_name_real_subcommands(command: str):
    assert f"kernel-agent {command}" in (REPO / "README.md").read_text()
