"""Programs the evaluator service starts itself get no secret of its environment: in `process` isolation any job
under the service's uid can read their /proc/<pid>/environ once they have exec'd."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.evaluator import split_build


def test_the_compiler_asked_for_its_version_sees_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A red-team pass found the split build's planning (on every CUDA load_inline request, in the service) running
    `$CXX --version` with the service's whole environment."""
    seen = tmp_path / "environ"
    compiler = tmp_path / "cxx"
    compiler.write_text(f"#!/bin/sh\nenv > {seen}\necho 'g++ (test) 1.0'\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-reach-a-child")
    split_build.binding_salt(())
    assert seen.exists(), "the compiler was not run"
    assert "sk-must-not-reach-a-child" not in seen.read_text()
