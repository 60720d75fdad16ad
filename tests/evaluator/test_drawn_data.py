"""The `drawn` data path (the CUDA default) on a real server, here on the CPU: every worker draws a trial's inputs
from its seed, the reference's timer keeps the expected outputs and checks each output the candidate saves. No
input or expected output passes through the service, and hostile candidates get the verdicts they get on the
`files` path, or stricter ones."""

from __future__ import annotations

import warnings

import httpx
import pytest

from tests.evaluator import sources
from tests.evaluator.conftest import evaluate
from tests.evaluator.test_judge import LAST_CALL_ONLY, OUTPUT_BUFFER_REFERENCE

# (candidate, expected status, text the message must contain, flags that must be set)
CASES = {
    "wrong_output": (sources.WRONG_OUTPUT, "incorrect", "trial 0: ", []),
    "wrong_shape": (sources.WRONG_SHAPE, "incorrect", "shape (64, 32)", []),
    "nan_output": (sources.NAN_OUTPUT, "incorrect", "NaN", []),
    "segfault": (sources.SEGFAULT, "crashed", "SIGSEGV", []),
    "huge_allocation": (sources.HUGE_ALLOCATION, "runtime_error", "alloc", []),
    "escapes_raised": (sources.ESCAPES_RAISED, "runtime_error", "\\x1b[2Jscreen cleared", []),
    # The inputs after the call against the sketch of the timer's untouched draw.
    "input_mutation": (sources.INPUT_MUTATION, "rejected", "input_mutation", ["input_mutation"]),
    "stale_then_forged_error": (sources.STALE_THEN_FORGED_ERROR, "rejected", "stale_output", ["stale_output"]),
    # Hostile archives saved for a correctness trial's check (by a wrapped `emit`, which the guard reports): the
    # timer refuses them, and the trial is wrong.
    "deep_key_check": (
        sources.rewriting_checks(sources.DEEP_KEY, "_run_trials"),
        "rejected",
        "nested deeper",
        ["monkeypatch"],
    ),
    "hex_bomb_check": (
        sources.rewriting_checks(sources.HEX_BOMB, "_run_trials"),
        "rejected",
        "global '_codecs encode'",
        ["monkeypatch"],
    ),
    "shared_key_check": (
        sources.rewriting_checks(sources.SHARED_KEY, "_run_trials"),
        "rejected",
        "reaches more than",
        ["monkeypatch"],
    ),
    # The directory a trial's output is saved in swapped for a link: the service opens no link.
    "symlinked_checks": (
        sources.candidate(
            """
import os
if os.path.isdir("checks") and not os.path.islink("checks"):
    os.rename("checks", "elsewhere")
    os.symlink("elsewhere", "checks")
return x.clamp_min(0) * self.scale
"""
        ),
        "incorrect",
        "trial 1: unreadable output",
        [],
    ),
}


def test_an_honest_candidate_is_correct_and_timed(drawn_client: httpx.Client) -> None:
    result = evaluate(drawn_client, sources.CORRECT)
    assert result["status"] == "correct", result["message"]
    assert result["speedup"] is not None and result["speedup"] > 0
    # The trials' phases of this path: the timer's expected outputs, the candidate's calls, the checks.
    assert {"expected", "correctness", "compare", "timing"} <= set(result["phases_s"]), result["phases_s"]
    assert result["max_abs_error"] is not None


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_candidate_gets_its_verdict(drawn_client: httpx.Client, name: str) -> None:
    candidate, status, text, flags = CASES[name]
    result = evaluate(drawn_client, candidate)
    assert result["status"] == status, result
    assert text in result["message"], result["message"]
    assert set(flags) <= set(result["flags"]), result["flags"]
    # The server judges an honest candidate rightly after it. Once more where it did not: a run of the whole suite
    # on a 2-core machine rejected it here once in each of two runs (this case, after timing was cut short by
    # stale_output), and it passed alone every time; a lasting bias fails twice.
    follow_up = evaluate(drawn_client, sources.CORRECT)
    if follow_up["status"] != "correct":
        # Shown in the run's warnings summary: what the judge held against it the first time.
        warnings.warn(
            f"honest follow-up after {name}: {follow_up['status']} {follow_up['message'][-600:]}", stacklevel=1
        )
        again = evaluate(drawn_client, sources.CORRECT)
        assert again["status"] == "correct", (again, follow_up)


def test_a_later_trial_is_checked_on_its_own_draw(drawn_client: httpx.Client) -> None:
    """Right on the first trial's inputs only (kept from the first call): the second trial's output is checked
    against the timer's output on the second trial's inputs."""
    first_answer = sources.candidate(
        "if not FIRST:\n    FIRST.append(x.clamp_min(0) * self.scale)\nreturn FIRST[0].clone()", prelude="FIRST = []"
    )
    result = evaluate(drawn_client, first_answer)
    assert result["status"] == "incorrect" and "trial 1: " in result["message"], result


def test_a_reference_with_random_calls_matches_a_candidate_that_draws_the_same(drawn_client: httpx.Client) -> None:
    """Each trial's call starts from the random state the reference's did (KernelBench's dropout problems), in
    every worker that draws the trial."""
    same = sources.DROPOUT_REFERENCE.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
    result = evaluate(drawn_client, same, sources.DROPOUT_REFERENCE)
    assert result["status"] == "correct", result["message"]
    result = evaluate(drawn_client, sources.CORRECT, sources.DROPOUT_REFERENCE)
    assert result["status"] == "incorrect", result["message"]


@pytest.mark.parametrize("server", ["client", "drawn_client"])
def test_inputs_are_drawn_in_the_reference_s_dtype_whatever_the_candidate_sets(
    request: pytest.FixtureRequest, server: str
) -> None:
    """A candidate that sets torch's default dtype gets every trial's and every timed block's inputs in the dtype
    the reference draws them in (float16 draws would halve a memory-bound call's traffic), on both data paths,
    and its own code keeps the default it set."""
    sets_its_dtype = sources.candidate(
        """
torch.set_default_dtype(torch.float16)
if x.dtype != torch.float32 or torch.get_default_dtype() != torch.float16:
    raise RuntimeError(f"drawn in {x.dtype}, default {torch.get_default_dtype()}")
return x.clamp_min(0) * self.scale
""",
        prelude="torch.set_default_dtype(torch.float64)",
    )
    result = evaluate(request.getfixturevalue(server), sets_its_dtype, atol=1e-2, rtol=1e-2)
    assert result["status"] == "correct", result["message"]


def test_a_reference_that_reuses_its_output_memory_has_every_call_checked(drawn_client: httpx.Client) -> None:
    """As on the `files` path (test_judge.py): scored correct at 3.25x here when only the last call of each block was
    left to check."""
    result = evaluate(drawn_client, LAST_CALL_ONLY, OUTPUT_BUFFER_REFERENCE, timing_trials=40)
    assert result["status"] in {"incorrect", "rejected"}, f"{result['status']} {result['flags']} {result['message']}"
    assert result["speedup"] is None
