"""Hostile candidates against a real server started with an import path of its own: nothing a candidate writes may
reach the import path of later workers or of the service, or any folder outside its own home and scratch places."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.evaluator import sources
from tests.evaluator.conftest import evaluate_briefly, server_env
from tests.servers import python_path, run_service

# Every entry of the worker's PYTHONPATH it can write to gets a sitecustomize.py that leaves a marker (its uid)
# beside itself in each Python process that starts later.
WRITE_SITECUSTOMIZE = sources.candidate(
    "return torch.relu(x) * self.scale",
    prelude='''
import os

_PAYLOAD = """
import os
try:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran-%d-%d" % (os.getuid(), os.getpid())), "w"):
        pass
except OSError:
    pass
"""
for _entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    try:
        with open(os.path.join(_entry, "sitecustomize.py"), "w") as _file:
            _file.write(_PAYLOAD)
    except OSError:
        pass
''',
)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sticky, world-writable directory (like /tmp) on the service's PYTHONPATH."""
    directory = tmp_path_factory.mktemp("shared-python-path")
    os.chmod(directory, 0o1777)
    return directory


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-path-cache")


@pytest.fixture(scope="module")
def shared_path_client(
    shared_dir: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    if os.geteuid() != 0:
        pytest.skip("needs strict isolation (root, namespaces)")
    log = tmp_path_factory.mktemp("shared-path-log") / "server.log"
    env = server_env(cache_dir, PYTHONPATH=python_path(str(shared_dir)))
    with run_service("evaluator", env=env, log_path=log) as url, httpx.Client(base_url=url, timeout=600) as http:
        if http.get("/health").json()["details"]["isolation"] != "strict":
            pytest.skip("needs strict isolation (root, namespaces)")
        yield http


def test_a_candidate_cannot_write_into_the_import_path_of_later_workers(
    shared_path_client: httpx.Client, shared_dir: Path
) -> None:
    first = evaluate_briefly(shared_path_client, WRITE_SITECUSTOMIZE)
    assert first["status"] == "correct", first["message"]
    # Later evaluations start fresh workers.
    second = evaluate_briefly(shared_path_client, sources.CORRECT)
    assert second["status"] == "correct", second["message"]
    planted = shared_dir / "sitecustomize.py"
    markers = sorted(p.name for p in shared_dir.glob("ran-*"))
    assert not planted.exists(), f"a candidate wrote {planted}; later processes that ran it: {markers}"
    assert not markers, f"processes ran a candidate's sitecustomize.py: {markers}"


def test_a_candidate_writes_nowhere_but_its_home_and_scratch_places(
    shared_path_client: httpx.Client, cache_dir: Path
) -> None:
    """A world-writable folder the job can reach (here in the build cache, which every job reads) is read-only to
    it, as is everything else outside its home; its home and /tmp stay writable."""
    loose = cache_dir / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    targets = [str(loose / "planted"), "HOME/written", "/tmp/written"]
    probe = sources.candidate(
        f"""
outcomes = {{}}
for path in {targets!r}:
    path = path.replace("HOME", os.environ["HOME"])
    try:
        with open(path, "w") as handle:
            handle.write("left by a job")
        outcomes[path.split("/")[-2]] = "written"
    except OSError as exc:
        outcomes[path.split("/")[-2]] = type(exc).__name__
raise RuntimeError(f"WROTE {{outcomes!r}}")
""",
        prelude="import os",
    )
    result = evaluate_briefly(shared_path_client, probe)
    found = re.search(r"RuntimeError: WROTE (.*)$", result["message"], re.MULTILINE)
    assert found, result["message"]
    outcomes = ast.literal_eval(found.group(1))
    home = next(name for name in outcomes if name not in {"loose", "tmp"})
    assert outcomes == {"loose": "OSError", "tmp": "written", home: "written"}, outcomes
    assert not list(loose.iterdir()), f"a job wrote into {loose}: {list(loose.iterdir())}"
