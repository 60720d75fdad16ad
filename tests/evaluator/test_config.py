"""Settings from the environment, and the sandbox pieces that need no worker."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.evaluator.config import HACK_FLAGS, Settings
from services.evaluator.sandbox import UidPool
from shared.serving import is_loopback


def test_reject_flags_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().reject_flags == HACK_FLAGS
    monkeypatch.setenv("EVALUATOR_REJECT_FLAGS", "monkeypatch, try_except_fallback")
    assert Settings().reject_flags == {"monkeypatch", "try_except_fallback"}
    monkeypatch.setenv("EVALUATOR_REJECT_FLAGS", '["input_mutation"]')
    assert Settings().reject_flags == {"input_mutation"}
    monkeypatch.setenv("EVALUATOR_REJECT_FLAGS", "no_such_flag")
    with pytest.raises(ValidationError, match="unknown flags"):
        Settings()


def test_isolation_and_token_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALUATOR_ISOLATION", "process")
    monkeypatch.setenv("EVALUATOR_TOKEN", "s3cret")
    settings = Settings()
    assert settings.isolation == "process" and settings.token_value == "s3cret"
    assert "s3cret" not in repr(settings)
    monkeypatch.setenv("EVALUATOR_ISOLATION", "none")
    with pytest.raises(ValidationError):
        Settings()


def test_uid_ranges_differ_between_starts() -> None:
    assert len({Settings().sandbox_uid_base for _ in range(5)}) > 1


def test_uid_pool_leases_each_uid_once() -> None:
    pool = UidPool(5000, 2)
    first, second = pool.lease(), pool.lease()
    assert first != second
    with pytest.raises(RuntimeError):
        pool.lease()
    pool.release(first)
    assert pool.lease() == first


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.org", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
