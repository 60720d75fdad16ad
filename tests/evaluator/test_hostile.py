"""Hostile candidates against the real server: each gets the right verdict, and a correct one right after is
still scored correct (the fault never leaks into the next job)."""

from __future__ import annotations

import httpx
import pytest

from services.evaluator.verdict import UNPRINTABLE
from tests.evaluator import sources
from tests.evaluator.conftest import FAKE_API_KEY, evaluate, evaluate_briefly

# (candidate, expected status, text the message must contain, flags that must be set)
CASES = {
    "syntax_error": (sources.SYNTAX_ERROR, "compile_error", "SyntaxError", []),
    "no_model_new": (sources.NO_MODEL_NEW, "compile_error", "ModelNew", []),
    "wrong_output": (sources.WRONG_OUTPUT, "incorrect", "differs", []),
    "wrong_shape": (sources.WRONG_SHAPE, "incorrect", "shape (64, 32)", []),
    "nan_output": (sources.NAN_OUTPUT, "incorrect", "NaN", []),
    "segfault": (sources.SEGFAULT, "crashed", "SIGSEGV", []),
    "os_exit": (sources.OS_EXIT, "crashed", "exited with code 7", []),
    "escapes_then_exit": (sources.ESCAPES_THEN_EXIT, "crashed", "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\x00done", []),
    "escapes_raised": (
        sources.ESCAPES_RAISED,
        "runtime_error",
        "RuntimeError: \\x1b[2Jscreen cleared\\x1b]0;owned\\x07 \\ud800 \\u202edesrever",
        [],
    ),
    "huge_allocation": (sources.HUGE_ALLOCATION, "runtime_error", "alloc", []),
    "input_mutation": (sources.INPUT_MUTATION, "rejected", "input_mutation", ["input_mutation"]),
    "patch_allclose": (sources.PATCH_ALLCLOSE, "rejected", "torch.allclose", ["monkeypatch"]),
    "patch_timer": (sources.PATCH_TIMER, "rejected", "time.perf_counter", ["monkeypatch"]),
    "import_reference": (sources.IMPORT_REFERENCE, "rejected", "uses_reference_model", ["uses_reference_model"]),
    "subclass_reference": (sources.SUBCLASS_REFERENCE, "rejected", "uses_reference_model", ["uses_reference_model"]),
    "forged_result_then_exit": (sources.FORGED_RESULT_THEN_EXIT, "crashed", "without a result", []),
    "unhashable_event_wrong": (sources.UNHASHABLE_EVENT_WRONG, "incorrect", "differs", []),
    "overflowing_ms": (sources.OVERFLOWING_MS, "rejected", "malformed timing reply", ["result_tampering"]),
    "deep_error_message_wrong": (
        sources.DEEP_ERROR_MESSAGE_WRONG,
        "rejected",
        "channel was flooded",
        ["result_tampering"],
    ),
    "stale_then_forged_error": (sources.STALE_THEN_FORGED_ERROR, "rejected", "stale_output", ["stale_output"]),
    "deep_key_output": (sources.DEEP_KEY_OUTPUT, "incorrect", "nested deeper", []),
    "hex_bomb_output": (sources.HEX_BOMB_OUTPUT, "incorrect", "global '_codecs encode'", []),
    "shared_key_output": (sources.SHARED_KEY_OUTPUT, "incorrect", "reaches more than", []),
    # The message comes from the log the worker wrote, whatever the job put at its path afterwards.
    "fifo_for_its_log": (sources.FIFO_FOR_ITS_LOG, "crashed", "written before the swap", []),
    "link_for_its_log": (sources.LINK_FOR_ITS_LOG, "crashed", "written before the swap", []),
}


def assert_still_correct(client: httpx.Client) -> None:
    """The service still gives an honest candidate its timed verdict after the hostile one."""
    result = evaluate_briefly(client, sources.CORRECT)
    assert result["status"] == "correct", result["message"]
    assert result["speedup"] is not None and result["speedup"] > 0


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_candidate_gets_its_verdict(any_client: httpx.Client, name: str) -> None:
    candidate, status, needle, flags = CASES[name]
    result = evaluate(any_client, candidate)
    assert result["status"] == status, result["message"]
    assert needle in result["message"]
    # Whatever the candidate printed or raised, the message holds no control character but tab and newline, no
    # lone surrogate, no invisible character that reorders text.
    assert not UNPRINTABLE.search(result["message"]), repr(result["message"][-500:])
    assert set(flags) <= set(result["flags"])
    assert result["correct"] is False and result["speedup"] is None
    assert "root:" not in result["message"]  # nothing of a file the job linked its log to
    assert_still_correct(any_client)


def test_infinite_loop_times_out(any_client: httpx.Client) -> None:
    result = evaluate(any_client, sources.INFINITE_LOOP, timeout_s=8)
    assert result["status"] == "timeout", result["message"]
    assert 8 <= result["duration_s"] < 30
    assert_still_correct(any_client)


def test_secret_in_service_environment_is_invisible(any_client: httpx.Client) -> None:
    """Not in the job's environment, and the service's own (its parent's in both levels) unreadable: another uid
    in strict isolation, a service that is not dumpable in process isolation."""
    result = evaluate(any_client, sources.READ_SECRET)
    assert result["status"] == "runtime_error"
    assert "SEEN" in result["message"], result["message"]
    assert FAKE_API_KEY not in result["message"]
    assert "'env': None" in result["message"]
    assert_still_correct(any_client)


def test_failing_reference_is_an_evaluator_error(client: httpx.Client) -> None:
    reference = sources.REFERENCE.replace("return torch.relu(x) * self.scale", "raise ValueError('reference bug')")
    result = evaluate(client, sources.CORRECT, reference=reference)
    assert result["status"] == "evaluator_error" and "reference bug" in result["message"]
    assert result["compiled"] is False and result["correct"] is False


# sources.CORRECT, after making 1,500 nested directories in its home.
DEEP_DIRECTORIES = (
    "import os\n"
    "_fd = os.open('.', os.O_RDONLY)\n"
    "for _ in range(1500):\n"
    "    os.mkdir('d', dir_fd=_fd)\n"
    "    _next = os.open('d', os.O_RDONLY, dir_fd=_fd)\n"
    "    os.close(_fd)\n"
    "    _fd = _next\n"
    "os.close(_fd)\n" + sources.CORRECT
)

# Opens files until the kernel refuses one, and says how many it got.
OPEN_FILES = """
import os
import torch

class ModelNew(torch.nn.Module):
    pass

fds = []
try:
    while len(fds) < 5000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
raise RuntimeError(f"opened {len(fds)} files")
"""


def test_a_job_that_leaves_deep_directories_keeps_its_verdict_and_its_uid(any_client: httpx.Client) -> None:
    """Removing its home must not fail on depth: shutil.rmtree recursed once per level, so the job's RecursionError
    became evaluator_error, and its uid and cgroup were never given back (18 such jobs ended every later request)."""
    for _ in range(3):
        result = evaluate(any_client, DEEP_DIRECTORIES, timing_trials=0)
        assert result["status"] == "correct", result["message"]
    assert_still_correct(any_client)


def test_a_job_opens_at_most_its_share_of_the_host_file_table(any_client: httpx.Client) -> None:
    result = evaluate(any_client, OPEN_FILES, timing_trials=0)
    assert result["status"] == "compile_error" and "opened" in result["message"], result["message"]
    opened = int(result["message"].rsplit("opened ", 1)[1].split()[0])
    assert opened < 1024, result["message"]
