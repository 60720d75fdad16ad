"""The built-in problem set: format, sizes, profiles, ids and hashes."""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from pathlib import Path

import pytest

import problems
from problems.kernelbench import is_valid_reference
from problems.registry import BUILTIN_TAGS, apply_profile
from tests.problems.conftest import run_problems

CPU = problems.builtin_problems("cpu")
GPU = problems.builtin_problems("gpu")
CPU_BUDGET_MS = 100.0
# Every idiom family the issue asks for, as tags.
REQUIRED_TAGS = {
    "elementwise",
    "activation",
    "softmax",
    "norm",
    "reduction",
    "matmul",
    "conv",
    "attention",
    "redundant",
}


def test_at_least_sixteen_problems_with_stable_sorted_ids():
    ids = [p.id for p in CPU]
    assert len(ids) >= 16
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith("builtin/") and p.name == i.removeprefix("builtin/") for i, p in zip(ids, CPU, strict=True))
    assert all(p.level == "builtin" for p in CPU)


def test_docs_list_every_problem_with_its_tags():
    # Ids are what configs and results refer to: the documented table must match the code exactly.
    docs = (Path(__file__).resolve().parents[2] / "docs" / "problems.md").read_text()
    rows = re.findall(r"^\| `(builtin/\w+)` \| ([\w, ]+) \|", docs, re.MULTILINE)
    documented = {pid: tuple(t.strip() for t in tags.split(",")) for pid, tags in rows}
    assert len(documented) == len(rows)
    assert documented == {p.id: p.tags for p in CPU}


def test_every_problem_has_tags_and_all_families_are_covered():
    assert {p.name for p in CPU} == set(BUILTIN_TAGS)
    assert REQUIRED_TAGS <= {tag for p in CPU for tag in p.tags}


@pytest.mark.parametrize("problem", CPU, ids=lambda p: p.name)
def test_source_is_kernelbench_format(problem):
    tree = ast.parse(problem.source)
    assert is_valid_reference(problem.source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in model.body)
    imported = {
        alias.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for alias in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])
    }
    assert imported <= {"torch", "math"}
    assert 'PROFILE = "cpu"' in problem.source


@pytest.mark.parametrize("problem", CPU, ids=lambda p: p.name)
def test_hash_is_sha256_of_source_and_stable(problem):
    assert problem.hash == hashlib.sha256(problem.source.encode()).hexdigest()
    again = problems.get_problem(problem.id)
    assert again == problem


def test_gpu_profile_differs_only_in_the_profile_line():
    for cpu, gpu in zip(CPU, GPU, strict=True):
        assert cpu.id == gpu.id and cpu.hash != gpu.hash
        changed = [
            line
            for line in difflib.ndiff(cpu.source.splitlines(), gpu.source.splitlines())
            if line.startswith(("+ ", "- "))
        ]
        assert changed == ['- PROFILE = "cpu"', '+ PROFILE = "gpu"'], cpu.id


def test_gpu_sizes_are_larger():
    # The SIZES dict is the same text in both profiles; compare its two entries by element count.
    for problem in CPU:
        sizes = next(
            ast.literal_eval(n.value)
            for n in ast.parse(problem.source).body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SIZES"
        )
        assert set(sizes) == {"cpu", "gpu"} and sizes["cpu"].keys() == sizes["gpu"].keys()
        assert all(sizes["gpu"][k] >= sizes["cpu"][k] for k in sizes["cpu"]), problem.id
        assert sizes["gpu"] != sizes["cpu"], problem.id


def test_apply_profile_rejects_unknown_profile_and_missing_line():
    with pytest.raises(ValueError, match="unknown profile"):
        apply_profile('PROFILE = "cpu"\n', "tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="found 0"):
        apply_profile("x = 1\n", "gpu")


def test_get_problem_unknown_id_names_the_known_ones():
    with pytest.raises(KeyError, match="builtin/softmax_primitives"):
        problems.get_problem("builtin/no_such_problem")


def test_load_problems_specs():
    assert [p.id for p in problems.load_problems("builtin")] == [p.id for p in CPU]
    assert [p.hash for p in problems.load_problems("builtin:gpu")] == [p.hash for p in GPU]
    assert [p.hash for p in problems.load_problems("builtin", profile="gpu")] == [p.hash for p in GPU]
    (one,) = problems.load_problems("builtin/softmax_primitives:gpu")
    assert one == problems.get_problem("builtin/softmax_primitives", "gpu")
    for bad in ("nonsense", "builtin:tpu", "kernelbench:x", "builtin/no_such_problem", "builtin/swish_manual:tpu"):
        with pytest.raises(ValueError):
            problems.load_problems(bad)


def test_cpu_profile_runs_fast_and_deterministically():
    reports = run_problems(CPU, "cpu", trials=10)
    assert set(reports) == {p.id for p in CPU}
    failures = {pid: r["error"] for pid, r in reports.items() if not r["ok"]}
    assert not failures
    for pid, report in reports.items():
        assert report["out_finite"] and report["deterministic"], pid
        assert report["median_ms"] < CPU_BUDGET_MS, (pid, report["median_ms"])


@pytest.mark.gpu
def test_gpu_profile_runs_on_cuda():
    # The device-node check first: it skips without paying for a torch import on CPU-only machines.
    if not Path("/dev/nvidiactl").exists():
        pytest.skip("needs CUDA")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reports = run_problems(GPU, "cuda", trials=5, timeout_s=900.0)
    failures = {pid: r["error"] for pid, r in reports.items() if not r["ok"]}
    assert not failures
    assert all(r["out_finite"] for r in reports.values())
