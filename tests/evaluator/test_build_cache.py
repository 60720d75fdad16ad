"""C++ `load_inline` candidates on CPU: built once, cached by content, reused across requests and restarts."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.evaluator import landlock
from tests.evaluator import sources
from tests.evaluator.conftest import FEW_TIMED_BLOCKS, evaluate_briefly, server_env
from tests.servers import run_service


def test_cpp_candidate_is_correct_then_cached(client: httpx.Client, build_cache_dir: Path) -> None:
    # The good and the broken extension build at once (two build slots); each gets its own verdict.
    with ThreadPoolExecutor(2) as pool:
        first_future = pool.submit(evaluate_briefly, client, sources.CPP_CORRECT, timeout_s=600)
        broken_future = pool.submit(evaluate_briefly, client, sources.CPP_COMPILE_ERROR, timeout_s=600)
        first, broken = first_future.result(), broken_future.result()
    assert first["status"] == "correct", first["message"]
    assert first["compiled"] and first["speedup"] is not None and first["speedup"] > 0
    assert first["candidate_ms"]["n"] == FEW_TIMED_BLOCKS and first["reference_ms"]["median"] > 0
    assert broken["status"] == "compile_error" and not broken["compiled"]
    assert broken["message"].startswith("compiler errors:") and "expected primary-expression" in broken["message"]
    published = [p for p in build_cache_dir.iterdir() if len(p.name) == 64]
    assert len(published) == 1 and any(published[0].glob("*.so"))
    # No split on a CPU: the builder's whole build, timed by the builder, recorded by the service.
    assert first["build_path"] == broken["build_path"] == "whole"
    assert 0 < first["phases_s"]["build_whole"] <= first["phases_s"]["build"]
    assert (published[0] / "build.json").read_text() == '{"build_path": "whole"}'

    start = time.monotonic()
    second = evaluate_briefly(client, sources.CPP_CORRECT)
    assert second["status"] == "correct" and second["cache_hit"] is True, second["message"]
    assert second["build_path"] == "whole" and "build_whole" not in second["phases_s"]
    assert first["cache_hit"] is False
    assert time.monotonic() - start < first["duration_s"] / 2


def test_cache_survives_restart(client: httpx.Client, build_cache_dir: Path, tmp_path: Path) -> None:
    warm = evaluate_briefly(client, sources.CPP_CORRECT, timeout_s=600)
    assert warm["status"] == "correct", warm["message"]
    with (
        run_service(
            "evaluator", env=server_env(build_cache_dir, EVALUATOR_WORKERS="1"), log_path=tmp_path / "server.log"
        ) as url,
        httpx.Client(base_url=url, timeout=600) as other,
    ):
        result = evaluate_briefly(other, sources.CPP_CORRECT)
    assert result["status"] == "correct" and result["cache_hit"] is True, result["message"]


def test_a_job_cannot_rewrite_the_build_cache(process_client: httpx.Client) -> None:
    """In process isolation the job's uid owns the build cache; its Landlock domain keeps its writes to its home (a
    red-team job had rewritten every library there, and a later correct C++ candidate got `compile_error`)."""
    if landlock.abi() == 0:
        pytest.skip("this kernel gives workers no Landlock domain")
    first = evaluate_briefly(process_client, sources.CPP_CORRECT, timeout_s=600)
    assert first["status"] == "correct", first["message"]
    poisoner = evaluate_briefly(process_client, sources.CACHE_POISONER)
    assert poisoner["status"] == "runtime_error", poisoner["message"]
    assert "POISONED ['PermissionError'" in poisoner["message"], poisoner["message"]
    cached = evaluate_briefly(process_client, sources.CPP_CORRECT)
    assert cached["status"] == "correct" and cached["cache_hit"] is True, cached["message"]


def test_a_rewritten_library_is_built_again(process_client: httpx.Client, process_home: Path) -> None:
    """Where a job can write the cache (process isolation without Landlock), the service serves a library only
    while its bytes are those it published, so a later evaluation never loads what was written there."""
    first = evaluate_briefly(process_client, sources.CPP_CORRECT, timeout_s=600)
    assert first["status"] == "correct", first["message"]
    libraries = list((process_home / "cache").glob("*/ext_*.so"))
    assert libraries
    for library in libraries:  # as CACHE_POISONER did from a job
        with open(library, "r+b") as handle:
            handle.truncate(0)
            handle.write(b"\x7fELF written by another evaluation")
    again = evaluate_briefly(process_client, sources.CPP_CORRECT, timeout_s=600)
    assert again["status"] == "correct" and again["cache_hit"] is False, again["message"]
    cached = evaluate_briefly(process_client, sources.CPP_CORRECT)
    assert cached["status"] == "correct" and cached["cache_hit"] is True, cached["message"]


@pytest.mark.parametrize(
    ("argument", "marker"),
    [
        ('extra_cflags=["-DX=1;echo$${IFS}ka$${IFS}shell;false;"]', "'-DX=1;echo"),
        ("extra_include_paths=[\"x';echo$${IFS}ka$${IFS}shell;'\"]", "extra_include_paths"),
    ],
    ids=["define", "include_path"],
)
def test_shell_words_in_build_arguments_run_nothing_in_the_builder(
    any_client: httpx.Client, argument: str, marker: str
) -> None:
    """torch writes flags into build.ninja unquoted (include paths shell-quoted, not escaped for ninja), and ninja
    runs each command through /bin/sh: a red-team candidate ran `id` in the builder through a `-D` value. Refused
    by name, and the command's output ("ka shell", which the flag's text does not contain) is nowhere in the
    verdict."""
    candidate = sources.CPP_CORRECT.replace('functions=["scaled_relu"])', f'functions=["scaled_relu"], {argument})')
    assert candidate != sources.CPP_CORRECT
    result = evaluate_briefly(any_client, candidate, timeout_s=600)
    assert result["status"] == "compile_error" and marker in result["message"], result["message"]
    assert "ka shell" not in result["message"]


def test_a_flag_that_runs_a_program_in_the_builder_is_refused(client: httpx.Client) -> None:
    """`-wrapper` makes g++ run each of its steps under a program of the candidate's choosing (a red-team candidate
    ran its own Python in the builder that way); `/usr/bin/env` passes the steps through, so without the allow-list
    the build succeeds and the candidate scores correct."""
    candidate = sources.CPP_CORRECT.replace(
        'functions=["scaled_relu"])', 'functions=["scaled_relu"], extra_ldflags=["-wrapper", "/usr/bin/env"])'
    )
    assert candidate != sources.CPP_CORRECT
    result = evaluate_briefly(client, candidate, timeout_s=600)
    assert result["status"] == "compile_error" and "'-wrapper'" in result["message"], result["message"]


def test_a_build_that_asks_for_torchs_own_precompiled_header_is_refused(any_client: httpx.Client) -> None:
    """torch writes it beside torch/extension.h, where every later build of every job would pick it up, with the
    requesting build's include paths and macros baked in; a red-team build asked for it, and only the install's
    owner stopped the write. Refused before anything is built."""
    candidate = sources.CPP_CORRECT.replace('functions=["scaled_relu"])', 'functions=["scaled_relu"], use_pch=True)')
    assert candidate != sources.CPP_CORRECT
    result = evaluate_briefly(any_client, candidate, timeout_s=600)
    assert result["status"] == "compile_error" and "use_pch is not supported" in result["message"], result["message"]
