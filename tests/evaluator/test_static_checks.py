"""Syntax-tree checks on references and candidates (nothing is imported or run)."""

from __future__ import annotations

import pytest

from services.evaluator.static_checks import check_candidate, reference_problems
from tests.evaluator import sources


def test_valid_reference_has_no_problems() -> None:
    assert reference_problems(sources.REFERENCE) == []


def test_reference_names_may_be_assigned_or_imported() -> None:
    source = "from torch.nn import ReLU as Model\nget_inputs = lambda: []\nfrom x import get_init_inputs\n"
    assert reference_problems(source) == []


@pytest.mark.parametrize(
    ("candidate", "flags"),
    [
        (sources.CORRECT, []),
        (sources.IMPORT_REFERENCE, ["uses_reference_model"]),
        (sources.SUBCLASS_REFERENCE, ["uses_reference_model"]),
        (sources.candidate("return globals()['Model'](self.scale)(x)"), ["uses_reference_model"]),
        (sources.candidate("return x", prelude="import reference"), ["uses_reference_model"]),
        (
            sources.candidate("try:\n    return fast(x)\nexcept Exception:\n    return x.relu()"),
            ["try_except_fallback"],
        ),
        (sources.candidate("try:\n    return fast(x)\nexcept Exception:\n    raise"), []),
    ],
)
def test_candidate_flags(candidate: str, flags: list[str]) -> None:
    check = check_candidate(candidate, require_custom_kernel=False)
    assert check.syntax_error is None and check.defines_model_new
    assert check.flags == flags


def test_own_model_class_is_not_the_reference() -> None:
    source = sources.CORRECT + "\nclass Model(torch.nn.Module):\n    pass\n\nhelper = Model()\n"
    assert check_candidate(source, require_custom_kernel=False).flags == []


def test_custom_kernel_requirement() -> None:
    assert check_candidate(sources.CORRECT, require_custom_kernel=True).flags == ["no_custom_kernel"]
    assert check_candidate(sources.CPP_CORRECT, require_custom_kernel=True).flags == []
    triton = "import triton\n@triton.jit\ndef k(x):\n    pass\n" + sources.CORRECT
    assert check_candidate(triton, require_custom_kernel=True).flags == []
    # Naming a function load_inline without the extension module is not a kernel.
    fake = "def load_inline(**kw):\n    return None\nload_inline(name='x')\n" + sources.CORRECT
    assert check_candidate(fake, require_custom_kernel=True).flags == ["no_custom_kernel"]


def test_syntax_error_and_missing_model_new() -> None:
    broken = check_candidate(sources.SYNTAX_ERROR, require_custom_kernel=False)
    assert broken.syntax_error is not None and "line" in broken.syntax_error
    assert not check_candidate(sources.NO_MODEL_NEW, require_custom_kernel=False).defines_model_new
    assert check_candidate("from kernels import ModelNew\n", require_custom_kernel=False).defines_model_new
