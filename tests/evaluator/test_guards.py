"""The worker's guard, in this process: what torch rebinds itself is not a candidate's patch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from services.evaluator.guards import Guard


@pytest.fixture
def restored_torch() -> Iterator[None]:
    dtype, storage = torch.get_default_dtype(), torch.Storage
    yield
    torch.set_default_dtype(dtype)
    torch.Storage = storage


@pytest.mark.usefixtures("restored_torch")
def test_set_default_dtype_is_not_a_patch() -> None:
    guard = Guard()
    torch.set_default_dtype(torch.float16)  # rebinds torch.Storage to torch.HalfStorage
    assert torch.Storage is torch.HalfStorage
    assert guard.replaced() == []


@pytest.mark.usefixtures("restored_torch")
def test_torch_storage_rebound_to_anything_else_is_a_patch() -> None:
    guard = Guard()
    torch.Storage = type("Storage", (), {})
    assert guard.replaced() == ["torch.Storage"]
