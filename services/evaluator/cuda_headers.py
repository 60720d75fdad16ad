"""Build a candidate's CUDA source against `torch/types.h` first, `torch/extension.h` only when that fails.

nvcc parses a `.cu` file's headers three times (cudafe++, cicc, and g++ on the generated host code), and
`torch/extension.h` is most of a cold build: on an H100 machine the same kernel and wrapper compile in 55 s with it
and 31 s with `torch/types.h` (BENCHMARKS.md). `torch/types.h` keeps what a kernel's wrapper uses (`torch::Tensor`,
the `torch::`/`at::` factory functions, `TORCH_CHECK`, the dispatch macros) and drops pybind11 and the autograd and
nn front ends, which belong in `main.cpp` (load_inline writes the bindings there, still with the full header).
The rewrite keeps line numbers, so compiler messages point at the candidate's own lines. A build that fails with a
missing declaration is rebuilt from the candidate's source as written, and that build decides; any other build
error would fail the same way with the full header, so it is reported from the first build.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FULL_INCLUDE = re.compile(r'^([ \t]*#[ \t]*include[ \t]*)[<"]torch/extension\.h[>"]', re.MULTILINE)
LIGHT_HEADER = "<torch/types.h>"

# What nvcc and g++ print when a declaration is missing: errors the full header may fix. Any other build error
# (syntax, types, ptxas, linking) would fail the same way with it, so it is reported without a second build.
MISSING_DECLARATION = re.compile(
    r"is undefined|has no member|not declared|incomplete type|no instance of|"
    r"does not name a type|no matching function|not a member of|has not been declared|"
    r"must be a class or namespace name|is not a template"
)


def lighten(cuda_sources: str | Sequence[str] | None) -> list[str] | None:
    """The sources with `torch/extension.h` swapped for `torch/types.h`, or None when no source includes it."""
    if not cuda_sources:
        return None
    sources = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    lightened = [FULL_INCLUDE.sub(lambda m: m.group(1) + LIGHT_HEADER, source) for source in sources]
    return lightened if lightened != sources else None


def may_need_full_header(build_error: str) -> bool:
    return MISSING_DECLARATION.search(build_error) is not None
