"""Extraction and validation of LLM replies: ast only, nothing is executed."""

from __future__ import annotations

from services.implementer.extract import code_blocks, extract, validate

MODULE = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_picks_the_block_that_defines_model_new() -> None:
    reply = f"First a helper:\n```python\nx = 1\n```\nThen the module:\n```python\n{MODULE}```\nDone."
    result = extract(reply)
    assert result.status == "ok" and result.source == MODULE


def test_largest_block_wins_and_untagged_fences_count() -> None:
    small = "class ModelNew:\n    pass\n"
    result = extract(f"```\n{small}```\n```py\n{MODULE}```")
    assert result.status == "ok" and result.source == MODULE


def test_unterminated_fence_is_still_read() -> None:
    assert extract(f"```python\n{MODULE}").status == "ok"


def test_bare_module_without_fences_is_accepted() -> None:
    assert extract(MODULE).status == "ok"


def test_prose_only_is_no_code() -> None:
    result = extract("You should fuse the two loops and use shared memory.")
    assert result.status == "no_code" and result.source is None


def test_other_languages_are_not_python() -> None:
    assert code_blocks("```cpp\nint main() {}\n```") == []
    assert extract("```cpp\nint main() {}\n```").status == "no_code"


def test_syntax_error_and_missing_class_are_invalid() -> None:
    broken = extract("```python\nclass ModelNew(:\n```")
    assert broken.status == "invalid_code" and "SyntaxError" in broken.message
    nested = extract("```python\ndef f():\n    class ModelNew:\n        pass\n```")
    assert nested.status == "invalid_code" and "ModelNew" in nested.message


def test_refusal_is_recognised() -> None:
    assert extract("I'm sorry, but I cannot assist with that request.").status == "refused"


def test_validate_never_runs_the_code(tmp_path) -> None:  # noqa: ANN001
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\nclass ModelNew:\n    pass\n"
    assert validate(source) is None
    assert not marker.exists()
