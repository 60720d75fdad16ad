"""The lighter CUDA include: which sources are rewritten, which build errors earn a second build, and the
loader's build-then-fall-back order (the builds themselves need a GPU: tests/evaluator/gpu/test_cuda_headers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.evaluator import build_cache, cuda_headers

KERNEL = """#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void k(float* x) {}
torch::Tensor f(torch::Tensor x) { return x; }
"""


def test_extension_include_becomes_types_include_on_the_same_line() -> None:
    (light,) = cuda_headers.lighten(KERNEL) or []
    assert light.splitlines()[0] == "#include <torch/types.h>"
    assert light.splitlines()[1:] == KERNEL.splitlines()[1:]


@pytest.mark.parametrize("spelling", ['#include "torch/extension.h"', "  #  include <torch/extension.h>"])
def test_other_spellings_of_the_include_are_rewritten(spelling: str) -> None:
    (light,) = cuda_headers.lighten([spelling + "\nint x;\n"]) or []
    assert "torch/types.h" in light and "extension.h" not in light


def test_sources_without_the_full_include_are_left_alone() -> None:
    assert cuda_headers.lighten("#include <ATen/ATen.h>\n") is None
    assert cuda_headers.lighten("// not #include <torch/extension.h>\n") is None
    assert cuda_headers.lighten(None) is None
    assert cuda_headers.lighten([]) is None


@pytest.mark.parametrize(
    ("message", "retry"),
    [
        ('cuda.cu(7): error: namespace "torch" has no member "nn"', True),
        ('cuda.cu(3): error: identifier "py" is undefined', True),
        ('cuda.cu(4): error: name followed by "::" must be a class or namespace name', True),
        ("cuda.cu:9:5: error: 'pybind11' was not declared in this scope", True),
        ('cuda.cu(4): error: expected a ";"', False),
        ("ptxas error   : Entry function uses too much shared data", False),
    ],
)
def test_only_missing_declarations_earn_a_full_header_build(message: str, retry: bool) -> None:
    assert cuda_headers.may_need_full_header(message) is retry


class RecordingBuild:
    """Stands in for load_inline (which needs CUDA): records each build's sources, fails the light ones as told."""

    def __init__(self, light_error: str | None) -> None:
        self.light_error = light_error
        self.calls: list[list[str]] = []
        self.found_in_build_dir: list[list[str]] = []
        self.cpp_sources_seen: list[list[str]] = []

    def __call__(self, **arguments: Any) -> str:
        sources = list(arguments["cuda_sources"])
        self.calls.append(sources)
        build_dir = Path(arguments["build_directory"])
        self.found_in_build_dir.append(sorted(p.name for p in build_dir.iterdir()))
        (build_dir / "partial.o").write_text("")
        self.cpp_sources_seen.append(list(arguments["cpp_sources"]))
        arguments["cpp_sources"].append("PYBIND11_MODULE(...)")  # as load_inline does to the list it is given
        if self.light_error and "torch/types.h" in sources[0]:
            raise RuntimeError(f"Error building extension 'x': {self.light_error}")
        return "module"


def _build(tmp_path: Path, fake: RecordingBuild, device: str = "cuda") -> tuple[Any, bool]:
    build_dir = tmp_path / "build" / "key"
    build_dir.mkdir(parents=True)
    arguments = {
        "name": "ext_key",
        "cpp_sources": ["decl;"],
        "cuda_sources": [KERNEL],
        "build_directory": str(build_dir),
    }
    return "module", build_cache.compile_extension(fake, arguments, "load_inline", device, build_dir)


def test_a_light_build_that_works_is_the_only_build(tmp_path: Path) -> None:
    fake = RecordingBuild(light_error=None)
    assert _build(tmp_path, fake) == ("module", True)
    assert len(fake.calls) == 1 and "torch/types.h" in fake.calls[0][0]


def test_a_missing_declaration_rebuilds_with_the_source_as_written(tmp_path: Path) -> None:
    fake = RecordingBuild(light_error='error: namespace "torch" has no member "nn"')
    assert _build(tmp_path, fake) == ("module", False)
    assert [call[0] for call in fake.calls] == [cuda_headers.lighten(KERNEL)[0], KERNEL]  # type: ignore[index]
    assert fake.found_in_build_dir == [[], []]  # the failed build's leftovers are gone before the second
    assert fake.cpp_sources_seen == [["decl;"], ["decl;"]]  # not the first attempt's bindings twice


def test_any_other_build_error_is_the_candidates_and_is_not_retried(tmp_path: Path) -> None:
    fake = RecordingBuild(light_error='error: expected a ";"')
    with pytest.raises(RuntimeError, match="expected a"):
        _build(tmp_path, fake)
    assert len(fake.calls) == 1


def test_cpu_builds_are_never_rewritten(tmp_path: Path) -> None:
    fake = RecordingBuild(light_error=None)
    assert _build(tmp_path, fake, device="cpu") == ("module", False)
    assert fake.calls == [[KERNEL]]
