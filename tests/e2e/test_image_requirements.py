"""docker/requirements.py: what each image installs before its sources (the groups of pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.servers import REPO

SCRIPT = REPO / "docker" / "requirements.py"


def image_requirements(group: str) -> list[str]:
    result = subprocess.run([sys.executable, str(SCRIPT), group], capture_output=True, text=True, check=True)
    return result.stdout.split()


def names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0] for r in requirements}


def test_each_image_gets_only_its_own_group() -> None:
    evaluator, implementer, trainer = (names(image_requirements(g)) for g in ("evaluator", "implementer", "trainer"))
    assert {"torch", "fastapi", "uvicorn", "pydantic", "httpx"} <= evaluator
    assert not {"trl", "transformers", "openai"} & evaluator
    assert "openai" in implementer and "torch" not in implementer
    assert {"torch", "trl", "peft", "transformers", "fastapi"} <= trainer
    assert all("kernel-agent" not in name for name in evaluator | implementer | trainer)


def test_all_is_the_union_of_the_groups() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = [g for g in project["optional-dependencies"] if g != "all"]
    union = set().union(*(image_requirements(g) for g in groups))
    assert set(image_requirements("all")) == union


def test_unknown_group_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "gpu"], capture_output=True, text=True)
    assert result.returncode != 0
    assert "no optional-dependency group 'gpu'" in result.stderr and "evaluator" in result.stderr


@pytest.mark.parametrize("group", ["evaluator", "implementer", "trainer"])
def test_no_duplicates(group: str) -> None:
    found = image_requirements(group)
    assert len(found) == len(set(found))
