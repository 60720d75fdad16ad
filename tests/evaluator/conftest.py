"""Fixtures: one real evaluator server per session (tmp cache, fake API key in its environment) and a client."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.evaluator.sources import REFERENCE
from tests.servers import python_path, run_service

FAKE_API_KEY = "sk-test-" + secrets.token_hex(8)
WORKERS = 2
# Who runs the `process`-isolation server when the tests run as root (the service refuses that level as root).
PROCESS_USER = "nobody"


def server_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    """Environment of a test evaluator: its own cache and uid range, a secret it must not leak."""
    return {
        # Keep the caller's import path after the repo (run_service puts only the repo there).
        "PYTHONPATH": python_path(),
        "EVALUATOR_CACHE_DIR": str(cache_dir),
        "EVALUATOR_WORKERS": str(WORKERS),
        "EVALUATOR_THREADS_PER_WORKER": "1",
        "EVALUATOR_MIN_SAMPLE_MS": "2",
        "EVALUATOR_DEFAULT_TIMEOUT_S": "240",
        "OPENAI_API_KEY": FAKE_API_KEY,
        "EVALUATOR_SANDBOX_UID_BASE": str(sandbox_uid_base()),
        **extra,
    }


_UID_BASE = 2_000_000 + secrets.randbelow(10_000) * 4096


def sandbox_uid_base() -> int:
    return _UID_BASE


@pytest.fixture(scope="session")
def build_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the session, so a C++ candidate is compiled once."""
    return tmp_path_factory.mktemp("evaluator-cache")


@pytest.fixture(scope="session")
def evaluator_url(build_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("evaluator-log") / "server.log"
    with run_service("evaluator", env=server_env(build_cache_dir), log_path=log) as url:
        yield url


@pytest.fixture(scope="session")
def drawn_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A server on the `drawn` data path (the CUDA default: workers draw every trial's inputs from its seed), with
    a build cache of its own, in the isolation the default server gets."""
    env = server_env(tmp_path_factory.mktemp("evaluator-drawn-cache"), EVALUATOR_DATA_PATH="drawn")
    log = tmp_path_factory.mktemp("evaluator-drawn-log") / "server.log"
    with run_service("evaluator", env=env, log_path=log) as url, httpx.Client(base_url=url, timeout=600) as http:
        yield http


@pytest.fixture(scope="session")
def client(evaluator_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=evaluator_url, timeout=600) as http:
        yield http


@contextlib.contextmanager
def process_server(log: Path, **extra: str) -> Iterator[tuple[httpx.Client, Path]]:
    """A server in `process` isolation: one unprivileged uid for the service and its jobs (as root, the tests start
    it as PROCESS_USER), with a home, cache and work directory of its own (yielded with the client), and the
    settings in `extra`."""
    home = Path(tempfile.mkdtemp(prefix="ka-process-isolation-"))
    try:
        home.chmod(0o755)
        if os.geteuid() == 0:
            user = pwd.getpwnam(PROCESS_USER)
            os.chown(home, user.pw_uid, user.pw_gid)
        env = server_env(
            home / "cache", HOME=str(home), EVALUATOR_ISOLATION="process", EVALUATOR_WORK_DIR=str(home), **extra
        )
        with (
            run_service("evaluator", env=env, log_path=log, user=PROCESS_USER) as url,
            httpx.Client(base_url=url, timeout=600) as http,
        ):
            assert http.get("/health").json()["details"]["isolation"] == "process"
            yield http, home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def process_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Path]]:
    with process_server(tmp_path_factory.mktemp("evaluator-process-log") / "server.log") as served:
        yield served


@pytest.fixture(scope="session")
def process_client(process_served: tuple[httpx.Client, Path]) -> httpx.Client:
    """The session's second server, in `process` isolation (process_server)."""
    return process_served[0]


@pytest.fixture(scope="session")
def process_home(process_served: tuple[httpx.Client, Path]) -> Path:
    """Home, cache and work directory of the session's `process`-isolation server."""
    return process_served[1]


@pytest.fixture(params=["strict", "process"])
def any_client(request: pytest.FixtureRequest) -> httpx.Client:
    """The session's servers in each isolation level: the default server where it runs strict, and the
    `process` one."""
    if request.param == "process":
        return request.getfixturevalue("process_client")
    request.getfixturevalue("strict_only")
    return request.getfixturevalue("client")


@pytest.fixture(scope="session")
def isolation(client: httpx.Client) -> str:
    return client.get("/health").json()["details"]["isolation"]


@pytest.fixture
def strict_only(isolation: str) -> None:
    if isolation != "strict":
        pytest.skip("needs strict isolation (root, namespaces)")


def evaluate(client: httpx.Client, candidate: str, reference: str = REFERENCE, **fields: Any) -> dict[str, Any]:
    """POST /evaluate with small trial counts; a fixed seed lets the server reuse the reference run."""
    body = {
        "reference_source": reference,
        "candidate_source": candidate,
        "correctness_trials": 2,
        "timing_trials": 10,
        "warmup_trials": 2,
        "seed": 1234,
        "timeout_s": 60,
        **fields,
    }
    response = client.post("/evaluate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# Timed blocks a side where a test's subject is not the timing (isolation, limits, builds, the service's health after a
# hostile job): the fewest that still time a correct candidate. test_judge.py holds the judge's clock to ten or more,
# which cost each evaluation of these tests 7 s more on a 2-core machine.
FEW_TIMED_BLOCKS = 3


def evaluate_briefly(client: httpx.Client, candidate: str, reference: str = REFERENCE, **fields: Any) -> dict[str, Any]:
    """`evaluate` with FEW_TIMED_BLOCKS timed blocks, unless the test asks for another count."""
    return evaluate(client, candidate, reference, **{"timing_trials": FEW_TIMED_BLOCKS, **fields})
