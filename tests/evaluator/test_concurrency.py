"""Many requests at once against the real server: every one answered, each with its own verdict."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import httpx
import pytest

from tests.evaluator import sources
from tests.evaluator.conftest import WORKERS, evaluate, server_env
from tests.servers import run_service

# Six rounds of the server's two slots: enough for answers to queue, swap or get lost (fifty took 330 s on 2 cores).
REQUESTS = 12


async def _post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        return await asyncio.gather(*(client.post("/evaluate", json=body) for body in bodies))


def test_many_concurrent_requests_all_answered(evaluator_url: str) -> None:
    # Alternate correct and wrong candidates, so a swapped or lost answer shows as a wrong verdict.
    bodies = [
        {
            "reference_source": sources.REFERENCE,
            "candidate_source": sources.CORRECT if i % 2 == 0 else sources.WRONG_OUTPUT,
            "correctness_trials": 1,
            "timing_trials": 2,
            "warmup_trials": 0,
            "seed": 99,
            "timeout_s": 900,
        }
        for i in range(REQUESTS)
    ]
    queue_seen = []

    async def run() -> list[httpx.Response]:
        task = asyncio.create_task(_post_all(evaluator_url, bodies))
        async with httpx.AsyncClient(base_url=evaluator_url, timeout=30) as probe:
            while not task.done():
                health = (await probe.get("/health")).json()["details"]
                queue_seen.append(health["queue_depth"])
                assert health["running"] <= WORKERS
                await asyncio.sleep(1.0)
        return await task

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * REQUESTS
    statuses = [r.json()["status"] for r in responses]
    assert statuses == ["correct" if i % 2 == 0 else "incorrect" for i in range(REQUESTS)]
    assert max(queue_seen) > 0, "requests beyond the worker count should have queued"
    # Each answer says where its time went, and the phases fit in its duration.
    results = [r.json() for r in responses]
    for result in results:
        phases = result["phases_s"]
        expected = {"queued", "reference", "startup", "build", "correctness", "compare"}
        # device_wait only where the evaluator has a GPU (device "auto" picks it)
        assert expected | ({"timing"} if result["status"] == "correct" else set()) == set(phases) - {"device_wait"}
        assert min(phases.values()) >= 0
        assert sum(v for k, v in phases.items() if k != "device_wait") <= result["duration_s"] + 0.01, result
    assert max(r["phases_s"]["queued"] for r in results) > 1.0, (
        f"{REQUESTS} requests on {WORKERS} workers should wait for a slot"
    )


def test_batch_and_queued_jobs(client: httpx.Client) -> None:
    item = {"reference_source": sources.REFERENCE, "correctness_trials": 1, "timing_trials": 2, "seed": 5}
    batch = client.post(
        "/evaluate/batch",
        json={
            "items": [
                {**item, "candidate_source": sources.CORRECT},
                {**item, "candidate_source": sources.WRONG_SHAPE},
            ]
        },
    )
    assert batch.status_code == 200, batch.text
    assert [r["status"] for r in batch.json()["results"]] == ["correct", "incorrect"]

    job = client.post("/evaluations", json={**item, "candidate_source": sources.CORRECT})
    assert job.status_code == 202 and job.json()["state"] in ("queued", "running")
    job_id = job.json()["id"]
    for _ in range(600):
        state = client.get(f"/evaluations/{job_id}").json()
        if state["state"] in ("done", "failed"):
            break
        time.sleep(0.2)
    assert state["state"] == "done" and state["result"]["status"] == "correct"
    assert client.get("/evaluations/no-such-job").status_code == 404


def _reference_runs(client: httpx.Client) -> float:
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith("evaluator_reference_runs_total"))
    return float(line.split()[-1])


def test_requests_with_one_seed_share_one_reference_run(client: httpx.Client, evaluator_url: str) -> None:
    # A reference no other test sends, so nothing is cached yet; as many requests as slots arrive together.
    reference = sources.REFERENCE + f"\n# {time.time_ns()}\n"
    body = {"reference_source": reference, "candidate_source": sources.CORRECT, "timing_trials": 2, "seed": 7}
    before = _reference_runs(client)
    responses = asyncio.run(_post_all(evaluator_url, [body] * (WORKERS + 1)))
    assert [r.json()["status"] for r in responses] == ["correct"] * (WORKERS + 1)
    assert _reference_runs(client) - before == 1
    # A new seed is a new reference run.
    assert client.post("/evaluate", json={**body, "seed": 8}).json()["status"] == "correct"
    assert _reference_runs(client) - before == 2
    # Seed 7 again: its reference comes from the cache.
    assert client.post("/evaluate", json=body).json()["status"] == "correct"
    assert _reference_runs(client) - before == 2


# At import: 100 busy loops, each in a session of its own (which defeats the kernel's per-session fairness), then 45 s
# of waiting; it answers wrong.
STARVES_THE_MACHINE = sources.candidate(
    "return torch.zeros_like(x)",
    prelude="""
import subprocess, time
for _ in range(100):
    subprocess.Popen(["setsid", "sh", "-c", "while :; do :; done"])
time.sleep(45)
""",
)


def test_a_job_s_busy_processes_do_not_starve_a_concurrent_evaluation(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A red-team job did this while another evaluation started (strict isolation): that evaluation's workers, which
    started meanwhile, waited for the CPU until their start timed out (`evaluator_error` after 131 s, with a 60 s
    time limit). Here every worker starts when an evaluation asks for it (no idle ones kept). Scheduled by job
    (job_cgroup), the busy loops share one job's part of the CPU."""
    env = server_env(tmp_path_factory.mktemp("starved-cache"), EVALUATOR_PRESPAWN="false")
    log = tmp_path_factory.mktemp("starved-log") / "server.log"
    with run_service("evaluator", env=env, log_path=log) as url, httpx.Client(base_url=url, timeout=600) as client:
        if client.get("/health").json()["details"]["isolation"] != "strict":
            pytest.skip("process isolation: the busy loops would outlive the job")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            starving = pool.submit(evaluate, client, STARVES_THE_MACHINE, seed=4777, timeout_s=120)
            time.sleep(8)
            started = time.monotonic()
            # Untimed: the starvation was of the workers' start; a timing beside 100 busy loops can be flagged
            # implausible_timing for noise, which is test_judge.py's subject and not this one's.
            honest = evaluate(client, sources.CORRECT, seed=4778, timeout_s=60, timing_trials=0)
            waited = time.monotonic() - started
            # Its own import, among its busy loops, can outlast its 120 s (a CI run on a slow day: 112 s to import).
            assert starving.result()["status"] in ("incorrect", "rejected", "timeout")
    assert honest["status"] == "correct", honest["message"]
    # Starved, it ended after 131 s; alone on a slow day it took 31 s (19 s on others).
    assert waited < 60, (waited, honest["phases_s"])
