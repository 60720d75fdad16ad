"""`kernel-agent serve implementer --help` names the settings' environment variables and their defaults."""

from __future__ import annotations

import pytest

from services.cli import main as kernel_agent


def test_help_names_backend_and_its_default(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        kernel_agent(["serve", "implementer", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kernel-agent serve implementer")
    assert "IMPLEMENTER_BACKEND (default: openai)" in out and "OPENAI_API_KEY" in out
