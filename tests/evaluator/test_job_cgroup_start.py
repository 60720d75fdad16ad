"""A worker's start with a job cgroup: the service checks that the worker's own processes are in the group, and a
process it does not own under the uid the worker leases (one a killed job left exiting) must not fail that check."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.evaluator import sources
from tests.evaluator.conftest import evaluate_briefly, sandbox_uid_base, server_env
from tests.servers import run_service

# Past the uids the session's other servers lease (10 per slot + 8 each).
UID_OFFSET = 3000


def test_a_process_left_under_a_leased_uid_does_not_fail_the_start(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs strict isolation (root, namespaces)")
    base = sandbox_uid_base() + UID_OFFSET
    squatter = subprocess.Popen(
        [sys.executable, "-c", f"import os, time; os.setgid({base}); os.setuid({base}); time.sleep(300)"]
    )
    try:
        time.sleep(0.5)  # it runs under the first uid the server will lease
        env = server_env(tmp_path / "cache", EVALUATOR_SANDBOX_UID_BASE=str(base), EVALUATOR_WORKERS="1")
        with (
            run_service("evaluator", env=env, log_path=tmp_path / "server.log") as url,
            httpx.Client(base_url=url, timeout=300) as http,
        ):
            if http.get("/health").json()["details"].get("job_cgroups") is None:
                pytest.skip("the service has no cgroups here")
            result = evaluate_briefly(http, sources.CORRECT)
        assert result["status"] == "correct", result["message"]
    finally:
        squatter.kill()
        squatter.wait()
