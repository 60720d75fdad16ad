"""The evaluator's command-line client: scoring math, file matching, errors, and a real evaluator server."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import problems
from services.evaluator import cli
from services.evaluator.cli import Outcome, fast_p, geomean_speedup
from shared.contracts.evaluator import EvaluationResult, EvaluationStatus
from tests.servers import REPO, free_port, run_service

SWISH_FAST = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.nn.functional.silu(x)
"""
WRONG = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return torch.sigmoid(x)
"""


# ---- pure math, hand-computed ----------------------------------------------------------------------------------------

OUTCOMES = [
    Outcome(True, 2.0),
    Outcome(True, 0.5),
    Outcome(True, 1.5),
    Outcome(False, None),
    Outcome(True, None),
]


def test_fast_p_counts_over_all_problems():
    assert fast_p(OUTCOMES, 0.0) == pytest.approx(4 / 5)  # correctness rate, the untimed one included
    assert fast_p(OUTCOMES, 1.0) == pytest.approx(2 / 5)  # 2.0 and 1.5
    assert fast_p(OUTCOMES, 1.5) == pytest.approx(1 / 5)  # strictly greater: 1.5 does not count
    assert fast_p(OUTCOMES, 2.0) == 0.0
    assert fast_p([], 1.0) == 0.0


def test_fast_p_ignores_speedup_of_incorrect_candidates():
    assert fast_p([Outcome(False, 10.0), Outcome(True, 3.0)], 1.0) == 0.5


def test_geomean_over_correct_timed_candidates():
    assert geomean_speedup(OUTCOMES) == pytest.approx((2.0 * 0.5 * 1.5) ** (1 / 3))
    assert geomean_speedup([Outcome(True, 4.0), Outcome(True, 1.0), Outcome(False, 100.0)]) == pytest.approx(2.0)
    assert geomean_speedup([Outcome(False, 2.0), Outcome(True, None)]) is None


def test_format_table_aligns_columns():
    text = cli.format_table(("a", "long header"), [("xyz", "1"), ("q", "22")])
    lines = text.splitlines()
    assert lines[0] == "a    long header"
    assert lines[1] == "---  -----------"
    assert lines[2] == "xyz  1" and lines[3] == "q    22"


def test_batch_report_over_all_selected_counts_missing_as_failed():
    problem = problems.get_problem("builtin/swish_manual")
    rows = [cli.BatchRow(problem, None), cli.BatchRow(problem, None)]
    text = cli.batch_report(rows)
    assert "2 selected, 0 with a candidate" in text and "missing candidates count as failed" in text


def test_note_states_the_cause_of_a_traceback():
    message = (
        'the reference failed: Traceback (most recent call last):\n  File "ref.py", line 3, in forward\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB\n"
    )
    note = cli.message_cause(message)
    assert note.startswith("the reference failed: torch.OutOfMemoryError: CUDA out of memory")
    assert "Traceback" not in note and "fix:" in note
    assert cli.message_cause("does not compile\nmore") == "does not compile"


def test_a_batch_rows_note_keeps_the_fix_of_a_long_cause():
    """The CPU allocator's words for a KernelBench problem at its size on a CPU: a cause longer than the note,
    whose fix must survive the cut."""
    message = (
        'the reference failed: Traceback (most recent call last):\n  File "reference.py", line 27\n'
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 6442450944 bytes. Error code 12 (Cannot allocate memory)\n"
    )
    result = EvaluationResult(status=EvaluationStatus.evaluator_error, compiled=False, correct=False, message=message)
    note = cli.BatchRow(problems.get_problem("builtin/swish_manual"), Path("c.py"), result).note
    assert note.startswith("the reference failed: RuntimeError: [enforce fail")
    assert note.endswith(f"(fix: {cli.MEMORY_FIX})")
    assert len(note) == cli.NOTE_CHARS + len(f" (fix: {cli.MEMORY_FIX})")


def test_a_correct_row_without_a_speedup_says_why():
    message = "not timed: at the reference's own pace (8700.0 ms a call with its drawing), a timing round needs ..."
    result = EvaluationResult(
        status=EvaluationStatus.correct, compiled=True, correct=True, flags=["not_timed"], message=message
    )
    note = cli.BatchRow(problems.get_problem("builtin/swish_manual"), Path("c.py"), result).note
    assert note.startswith("not timed: at the reference's own pace") and note.endswith("--timing-trials)")
    timed = result.model_copy(update={"speedup": 1.5, "flags": [], "message": ""})
    assert cli.BatchRow(problems.get_problem("builtin/swish_manual"), Path("c.py"), timed).note == ""


def test_timeout_goes_into_the_request():
    args = cli.build_parser().parse_args(["score", "--reference", "r.py", "--candidate", "c.py", "--timeout", "30"])
    assert cli.make_request(args, "x = 1", "y = 2").timeout_s == 30.0
    assert cli.http_timeout(args) > 2 * 30.0  # a split run and its whole rerun each get the limit


def test_kernel_agent_dispatches_and_rejects_unknown(capsys: pytest.CaptureFixture[str]):
    from services.cli import main as kernel_agent

    assert kernel_agent(["problems", "--problems", "builtin"]) == 0
    assert "builtin/swish_manual" in capsys.readouterr().out
    assert kernel_agent(["serve", "nothing"]) == 2
    assert "unknown command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_agent(["score", "--timeout", "0", "--reference", "a", "--candidate", "b"])


def test_candidate_matching_both_layouts(tmp_path: Path):
    picked = [p for p in problems.builtin_problems() if p.name in {"swish_manual", "row_l2_norm", "mse_reduction"}]
    kb = [
        problems.Problem(
            id=f"kernelbench/level1/{n}_{p.name}", name=f"{n}_{p.name}", source=p.source, hash=p.hash, level="level1"
        )
        for n, p in enumerate(picked, start=1)
    ]
    (tmp_path / f"{kb[0].name}.py").write_text("x")
    (tmp_path / f"level1_{kb[1].name}.py").write_text("x")
    (tmp_path / "stray.py").write_text("x")
    rows, unmatched = cli.match_candidates(kb, tmp_path)
    assert [r.candidate.name if r.candidate else None for r in rows] == [
        f"{kb[0].name}.py",
        f"level1_{kb[1].name}.py",
        None,
    ]
    assert [r.status for r in rows][2] == "missing" and unmatched == [tmp_path / "stray.py"]


# ---- errors the user can fix -----------------------------------------------------------------------------------------


def test_missing_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    ref = tmp_path / "ref.py"
    ref.write_text(problems.get_problem("builtin/swish_manual").source)
    code = cli.main(["score", "--reference", str(ref), "--candidate", str(tmp_path / "nope.py")])
    assert code == 2 and "candidate file not found" in capsys.readouterr().err


def test_unreachable_server_names_the_start_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    ref, cand = tmp_path / "ref.py", tmp_path / "cand.py"
    ref.write_text(problems.get_problem("builtin/swish_manual").source)
    cand.write_text(SWISH_FAST)
    url = f"http://127.0.0.1:{free_port()}"
    code = cli.main(["score", "--reference", str(ref), "--candidate", str(cand), "--url", url])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot reach the evaluator at {url}" in err and "python -m services.evaluator" in err


def test_out_of_range_option_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    ref = tmp_path / "ref.py"
    ref.write_text(problems.get_problem("builtin/swish_manual").source)
    code = cli.main(["score", "--reference", str(ref), "--candidate", str(ref), "--timing-trials", "-1"])
    assert code == 2 and "timing_trials" in capsys.readouterr().err


def test_missing_candidates_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code = cli.main(["batch", "--problems", "builtin", "--candidates", str(tmp_path / "none")])
    assert code == 2 and "candidates folder not found" in capsys.readouterr().err


# ---- against a real evaluator server ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def evaluator_url(tmp_path_factory: pytest.TempPathFactory):
    if not (REPO / "services" / "evaluator" / "__main__.py").exists():
        pytest.fail("services/evaluator/__main__.py is missing")
    cache = tmp_path_factory.mktemp("evaluator-cache")
    log = tmp_path_factory.mktemp("evaluator-log") / "server.log"
    env = {"EVALUATOR_CACHE_DIR": str(cache), "EVALUATOR_WORKERS": "2"}
    with run_service("evaluator", env=env, log_path=log) as url:
        yield url


def run_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.evaluator.cli", *args, "--url", url, "--timing-trials", "5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_score_prints_a_verdict_table_and_json(evaluator_url: str, tmp_path: Path):
    ref, good, bad = tmp_path / "ref.py", tmp_path / "good.py", tmp_path / "bad.py"
    ref.write_text(problems.get_problem("builtin/swish_manual").source)
    good.write_text(SWISH_FAST)
    bad.write_text(WRONG)
    table = run_cli("score", "--reference", str(ref), "--candidate", str(good), "--device", "cpu", url=evaluator_url)
    assert table.returncode == 0, table.stdout + table.stderr
    assert re.search(r"^status\s+correct$", table.stdout, re.MULTILINE)
    assert re.search(r"^speedup\s+\d+\.\d{3}x$", table.stdout, re.MULTILINE)
    assert re.search(r"^device\s+cpu", table.stdout, re.MULTILINE)
    wrong = run_cli("score", "--reference", str(ref), "--candidate", str(bad), "--json", url=evaluator_url)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    verdict = json.loads(wrong.stdout)
    assert verdict["status"] == "incorrect" and verdict["compiled"] and not verdict["correct"]
    assert verdict["speedup"] is None and verdict["max_abs_error"] > 0.1


def _fake_checkout(root: Path) -> list[problems.Problem]:
    names = ["swish_manual", "elementwise_chain", "row_l2_norm"]
    level1 = root / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    for number, name in enumerate(names, start=1):
        (level1 / f"{number}_{name}.py").write_text(problems.get_problem(f"builtin/{name}").source)
    return problems.load_kernelbench(root, levels=(1,))


def test_batch_scores_a_folder_and_reports_fast_p(evaluator_url: str, tmp_path: Path):
    loaded = _fake_checkout(tmp_path / "kb")
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    (candidates / "1_swish_manual.py").write_text(SWISH_FAST)  # correct
    (candidates / "level1_2_elementwise_chain.py").write_text(WRONG)  # incorrect; 3_row_l2_norm has none
    out = tmp_path / "results.jsonl"
    proc = run_cli(
        "batch",
        "--kernelbench",
        str(tmp_path / "kb"),
        "--level",
        "1",
        "--candidates",
        str(candidates),
        "--concurrency",
        "2",
        "--out",
        str(out),
        url=evaluator_url,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[2/2]" in proc.stderr, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # only the problems with a candidate are reported, and fast_p is over them (--all: over every selected one)
    assert [r["problem_id"] for r in records] == [p.id for p in loaded[:2]]
    assert [r["status"] for r in records] == ["correct", "incorrect"], records
    assert "3_row_l2_norm" not in proc.stdout
    assert "3 selected, 2 with a candidate" in proc.stdout and "fast_p over 2 problem(s)" in proc.stdout
    speedup = records[0]["result"]["speedup"]
    assert speedup > 0
    assert "fast_0: 0.500" in proc.stdout, proc.stdout
    for p in (1.0, 1.5, 2.0):
        assert f"fast_{p:g}: {(1 / 2 if speedup > p else 0.0):.3f}" in proc.stdout, (speedup, proc.stdout)
    assert "scoring 2 candidate(s)" in proc.stderr
    geomean = float(re.search(r"geomean speedup \(correct\): ([\d.]+)x", proc.stdout).group(1))
    assert math.isclose(geomean, speedup, rel_tol=1e-3, abs_tol=1e-3)


def test_serve_evaluator_help_names_its_command_and_environment(capsys: pytest.CaptureFixture[str]):
    from services.cli import main as kernel_agent

    with pytest.raises(SystemExit) as exited:
        kernel_agent(["serve", "evaluator", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kernel-agent serve evaluator")
    assert "EVALUATOR_ISOLATION (default: unset)" in out and "strongest one that works" in out
    assert "EVALUATOR_TOKEN (default: unset)" in out
    assert "(default: 8001)" in out
