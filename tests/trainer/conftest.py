"""Fixtures of the trainer tests: the SmolLM2 tokenizer (converted once from the embedded GGUF) and a tiny policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

CACHE_ROOT = Path("~/.cache/kernel-agent/models").expanduser()


@pytest.fixture(scope="session")
def tokenizer():
    from services.trainer.policy import RANDOM_TINY, load_tokenizer

    return load_tokenizer(RANDOM_TINY, CACHE_ROOT)


@pytest.fixture
def drawn_from(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The logits every token the compiled sampler draws was drawn from, in order (sample_next_token recorded)."""
    from services.trainer import sampling

    recorded: list[torch.Tensor] = []
    draw = sampling.sample_next_token

    def recording(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
        recorded.append(logits.float().clone())
        return draw(logits, temperature, top_p)

    monkeypatch.setattr(sampling, "sample_next_token", recording)
    return recorded
