"""Every `docker compose ... up` command in README.md and docs/docker.md is a valid compose project as written.

Each fenced bash block's command (its `export`s and `VAR=value` prefixes included) is run as `docker compose
... config -q`, which reads and interpolates the files without an engine. Placeholders (`sk-...`, `$(...)`,
`$HOME/...`) get stand-in values. Skipped where neither `docker compose` nor `docker-compose` is installed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.e2e.docker_engine import compose_command
from tests.servers import REPO

BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def documented_commands() -> list[tuple[str, dict[str, str], list[str]]]:
    """(where, environment, compose arguments before the subcommand) of every documented `up`."""
    found: list[tuple[str, dict[str, str], list[str]]] = []
    for doc in ("README.md", "docs/docker.md"):
        exported: dict[str, str] = {}  # a doc's exports hold for its later commands, as in one shell
        for block in BLOCK.findall((REPO / doc).read_text()):
            text = re.sub(r"\\\n\s*", " ", block)  # join continued lines
            text = re.sub(r"\$\(.*\)", "stand-in", text)
            for line in (raw.strip() for raw in text.splitlines()):
                if "docker compose" not in line and not line.startswith("export "):
                    continue
                words = shlex.split(line.split("#")[0])
                if words[:1] == ["export"]:
                    exported.update(w.split("=", 1) for w in words[1:] if "=" in w)
                    continue
                env = dict(exported)
                while words and ASSIGNMENT.match(words[0]):
                    key, value = words.pop(0).split("=", 1)
                    env[key] = value
                if words[:2] == ["docker", "compose"] and "up" in words:
                    found.append((f"{doc}: {line}", env, words[2 : words.index("up")]))
    return found


def test_the_design_command_is_documented():
    commands = [args for _, _, args in documented_commands()]
    design = ["--env-file", "docker/design.env", "-f", "docker-compose.yml", "-f", "docker/compose.gpu.yml"]
    assert [*design, "-f", "docker/compose.design.yml"] in commands
    assert len(commands) >= 4


@pytest.mark.parametrize(("where", "env", "args"), documented_commands(), ids=lambda v: str(v)[:60])
def test_documented_command_is_a_valid_compose_project(
    where: str, env: dict[str, str], args: list[str], tmp_path: Path
) -> None:
    compose = compose_command()
    if compose is None:
        pytest.skip("needs docker compose or docker-compose (no engine)")
    values = {k: ("stand-in" if "..." in v else v.replace("$HOME", str(tmp_path))) for k, v in env.items()}
    ours = ("EVALUATOR_", "TRAINER_", "OPENAI_", "IMPLEMENTER_", "KERNELBENCH_", "KERNEL_AGENT_")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    environment.update(values)
    proc = subprocess.run(
        [*compose, *args, "config", "-q"], cwd=REPO, env=environment, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{where}\n{proc.stderr}"


def test_the_design_needs_its_key_and_checkout(tmp_path: Path) -> None:
    compose = compose_command()
    if compose is None:
        pytest.skip("needs docker compose or docker-compose (no engine)")
    args = ["--env-file", "docker/design.env", "-f", "docker-compose.yml", "-f", "docker/compose.gpu.yml"]
    args += ["-f", "docker/compose.design.yml", "config"]
    base = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "KERNELBENCH_PATH")}
    base["KERNEL_AGENT_TOKEN"] = "t"
    for env, missing in (
        ({"KERNELBENCH_PATH": str(tmp_path)}, "OPENAI_API_KEY"),
        ({"OPENAI_API_KEY": "k"}, "KERNELBENCH"),
    ):
        proc = subprocess.run([*compose, *args], cwd=REPO, env={**base, **env}, capture_output=True, text=True)
        assert proc.returncode != 0 and missing in proc.stderr, proc.stderr
    proc = subprocess.run(
        [*compose, *args],
        cwd=REPO,
        env={**base, "OPENAI_API_KEY": "k", "KERNELBENCH_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    for expected in ("torch==2.13.0+cu128", "configs/qwen2-gpt4o.yaml", f"{tmp_path}:/kernelbench:ro", "size=16g"):
        assert expected in proc.stdout, expected
