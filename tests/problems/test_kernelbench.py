"""The KernelBench loader on a fake checkout built from the built-in problems, and the offline HF path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import problems
from problems.kernelbench import KernelBenchUnavailable, load_checkout
from tests.servers import free_port

BUILTIN = problems.builtin_problems()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """<tmp>/KernelBench/level{1,2}/<N>_<Name>.py, numbered so that lexical and numeric order differ."""
    level1 = tmp_path / "KernelBench" / "level1"
    level2 = tmp_path / "KernelBench" / "level2"
    level1.mkdir(parents=True)
    level2.mkdir()
    for number, problem in enumerate(BUILTIN[:11], start=1):
        (level1 / f"{number}_{problem.name}.py").write_text(problem.source)
    (level1 / "12_Broken.py").write_text("import torch\n\nclass Model(torch.nn.Module):\n    pass\n")
    (level1 / "13_NotPython.py").write_text("def (:\n")
    (level2 / "1_Second.py").write_text(BUILTIN[-1].source)
    (level2 / "notes.txt").write_text("not a problem")
    return tmp_path


def test_level1_sorted_numerically_with_ids_and_hashes(checkout: Path):
    loaded = problems.load_kernelbench(checkout, levels=(1,))
    assert [p.name for p in loaded] == [f"{n}_{p.name}" for n, p in enumerate(BUILTIN[:11], start=1)]
    assert loaded[9].id == f"kernelbench/level1/10_{BUILTIN[9].name}"
    assert all(p.level == "level1" for p in loaded)
    assert [p.hash for p in loaded] == [p.hash for p in BUILTIN[:11]]


def test_invalid_files_are_skipped_with_a_warning(checkout: Path, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="problems.kernelbench"):
        loaded = problems.load_kernelbench(checkout, levels=(1,))
    assert not any(p.name in {"12_Broken", "13_NotPython"} for p in loaded)
    assert "12_Broken.py" in caplog.text and "13_NotPython.py" in caplog.text


def test_level_filtering_and_accepted_paths(checkout: Path):
    both = problems.load_kernelbench(checkout, levels=(2, 1))
    assert [p.level for p in both] == ["level1"] * 11 + ["level2"]
    assert [p.id for p in problems.load_kernelbench(checkout, levels=(2,))] == ["kernelbench/level2/1_Second"]
    inner = problems.load_kernelbench(checkout / "KernelBench", levels=(1, 2))
    assert [p.id for p in inner] == [p.id for p in both]
    single = problems.load_kernelbench(checkout / "KernelBench" / "level2", levels=(2,))
    assert [p.id for p in single] == ["kernelbench/level2/1_Second"]


def test_env_var_and_spec_string(checkout: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KERNELBENCH_PATH", str(checkout))
    assert len(problems.load_kernelbench(levels=(1,))) == 11
    assert len(problems.load_problems("kernelbench:1,2")) == 12
    monkeypatch.delenv("KERNELBENCH_PATH")
    assert [p.id for p in problems.load_problems(f"kernelbench:2@{checkout}")] == ["kernelbench/level2/1_Second"]
    monkeypatch.setenv("KERNELBENCH_PATH", str(checkout))
    assert problems.get_problem("kernelbench/level2/1_Second").source == BUILTIN[-1].source
    with pytest.raises(KeyError):
        problems.get_problem("kernelbench/level2/99_Missing")


def test_bad_paths_and_levels_are_clear_errors(tmp_path: Path):
    with pytest.raises(KernelBenchUnavailable, match="not a folder"):
        load_checkout(tmp_path / "missing")
    with pytest.raises(KernelBenchUnavailable, match="no KernelBench/level"):
        load_checkout(tmp_path)
    with pytest.raises(ValueError, match="unknown KernelBench level"):
        problems.load_kernelbench(tmp_path, levels=(7,))


def test_hf_dataset_offline_is_a_clear_error(tmp_path: Path):
    # A subprocess, because `datasets` reads the offline switches once, when it is first imported.
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": str(REPO),
    }
    env.pop("KERNELBENCH_PATH", None)
    code = (
        "import problems, time\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    problems.load_kernelbench(levels=(1,))\n"
        "except problems.KernelBenchUnavailable as exc:\n"
        "    print('UNAVAILABLE', round(time.monotonic() - start, 1), exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("UNAVAILABLE"), proc.stdout
    assert "KERNELBENCH_PATH" in proc.stdout and "ScalingIntelligence/KernelBench" in proc.stdout
    assert float(proc.stdout.split()[1]) < 60


def test_unreachable_hub_fails_fast_with_the_fix(monkeypatch: pytest.MonkeyPatch):
    # Nothing listens on a fresh free port: the probe is refused at once, without the hub client's retries.
    monkeypatch.delenv("KERNELBENCH_PATH", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(KernelBenchUnavailable, match="KERNELBENCH_PATH") as info:
        problems.load_kernelbench(levels=(1,))
    assert "HF_HUB_OFFLINE=1" in str(info.value)
    assert time.monotonic() - start < 5
