"""`phases_s`: the seconds of a candidate run per phase, from the arrival times of the worker's events."""

from __future__ import annotations

from services.evaluator.pool import WorkerOutcome
from services.evaluator.verdict import CandidateRun

EXITED = WorkerOutcome(returncode=0, timed_out=False, stdio_tail="")


def event(name: str, at: float, **fields: object) -> dict[str, object]:
    return {"event": name, "received_at": at, **fields}


def test_timed_run_has_every_phase() -> None:
    events = [
        event("compiled", 14.0),
        event("device_acquired", 14.5, wait_s=0.5),
        event("outputs_written", 16.0),
        event("device_acquired", 17.25, wait_s=0.25),
        event("result", 19.0),
    ]
    run = CandidateRun(events, EXITED, timed=True, go_sent_at=16.5, startup_s=2.0, job_sent_at=10.0, compare_s=0.5)
    assert run.phases() == {
        "startup": 2.0,
        "build": 4.0,
        "correctness": 2.0,
        "compare": 0.5,
        "timing": 2.5,
        "device_wait": 0.75,
    }


def test_compile_error_ends_at_build() -> None:
    run = CandidateRun([event("error", 40.0, stage="compile")], EXITED, startup_s=1.0, job_sent_at=10.0)
    assert run.phases() == {"startup": 1.0, "build": 30.0}


def test_runtime_error_ends_correctness() -> None:
    events = [event("compiled", 11.0), event("error", 13.5, stage="run")]
    run = CandidateRun(events, EXITED, startup_s=1.0, job_sent_at=10.0)
    assert run.phases() == {"startup": 1.0, "build": 1.0, "correctness": 2.5}


def test_untimed_run_has_no_timing() -> None:
    events = [event("compiled", 11.0), event("outputs_written", 12.0), event("result", 12.1)]
    run = CandidateRun(events, EXITED, timed=False, go_sent_at=12.05, startup_s=1.0, job_sent_at=10.0, compare_s=0.05)
    assert set(run.phases()) == {"startup", "build", "correctness", "compare"}


def test_events_forged_before_a_phase_began_do_not_end_it() -> None:
    # candidate code printed a result (and a negative GPU wait) while it was being imported
    events = [
        event("result", 11.0),
        event("device_acquired", 11.5, wait_s=-100.0),
        event("compiled", 12.0),
        event("outputs_written", 13.0),
        event("result", 15.0),
    ]
    run = CandidateRun(events, EXITED, timed=True, go_sent_at=13.5, startup_s=1.0, job_sent_at=10.0, compare_s=0.25)
    assert run.phases() == {
        "startup": 1.0,
        "build": 2.0,  # the forged result before "compiled" does not end the build
        "correctness": 1.0,
        "compare": 0.25,
        "timing": 1.5,  # ends at the result after the go, not the forged one
        "device_wait": 0.0,
    }
