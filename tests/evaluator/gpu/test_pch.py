"""The precompiled header is built once, used by g++ for a main.cpp like load_inline's, and builds still work."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from services.evaluator import pch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = pch.ensure_pch(tmp_path_factory.mktemp("cache"), ["-O3"])
    assert built is not None and built.with_name(built.name + ".gch").is_file()
    return built


def test_device_arch_is_read_from_the_device() -> None:
    major, minor = torch.cuda.get_device_capability(0)
    assert pch.device_arch(0) == f"{major}.{minor}"


def test_second_request_reuses_the_pch(header: Path) -> None:
    t0 = time.perf_counter()
    again = pch.ensure_pch(header.parents[2], ["-O3"])
    assert again == header and time.perf_counter() - t0 < 5


def test_gcc_uses_the_pch_for_a_load_inline_main_cpp(header: Path, tmp_path: Path) -> None:
    flags = pch._ninja_cflags(["-O3"], with_cuda=True)
    assert flags is not None
    main_cpp = tmp_path / "main.cpp"
    main_cpp.write_text("#include <torch/extension.h>\ntorch::Tensor twice(torch::Tensor x) { return x * 2; }\n")
    cmd = [
        pch._compiler(),
        "-DTORCH_EXTENSION_NAME=ext_other_name",
        *flags,
        *pch.pch_cflags(header),
        "-H",
        "-c",
        str(main_cpp),
        "-o",
        str(tmp_path / "main.o"),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    # g++ -H marks a used precompiled header with "!" and one it had to skip with "x"
    assert f"! {header}.gch" in run.stderr, run.stderr[:2000]
    assert "invalid" not in run.stderr.lower()
