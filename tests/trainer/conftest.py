"""Fixtures of the trainer tests: the SmolLM2 tokenizer (converted once from the embedded GGUF) and a tiny policy."""

from __future__ import annotations

from pathlib import Path

import pytest

CACHE_ROOT = Path("~/.cache/kernel-agent/models").expanduser()


@pytest.fixture(scope="session")
def tokenizer():
    from services.trainer.policy import RANDOM_TINY, load_tokenizer

    return load_tokenizer(RANDOM_TINY, CACHE_ROOT)
