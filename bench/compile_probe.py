"""Where does a cold `load_inline` CUDA build spend its time, and what do the device arch and a PCH save?

Each variant builds the same trivial extension in a fresh build directory in a fresh process, so nothing is
cached between variants. Run on a CUDA machine: `python bench/compile_probe.py --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CUDA_SRC = r"""
#include <torch/extension.h>
__global__ void relu_kernel_TAG(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_TAG(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel_TAG<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
CPP_SRC = "torch::Tensor relu_TAG(torch::Tensor x);"

BUILD_SNIPPET = """
import os, sys, time, json
sys.path.insert(0, {repo!r})
t0 = time.perf_counter()
from torch.utils.cpp_extension import load_inline
extra_cflags = json.loads({cflags!r})
if {use_pch!r}:
    from services.evaluator import pch
    tp = time.perf_counter()
    header = pch.ensure_pch({cache!r}, extra_cflags)
    pch_s = time.perf_counter() - tp
    extra_cflags = extra_cflags + pch.pch_cflags(header)
else:
    pch_s = 0.0
tb = time.perf_counter()
mod = load_inline(name={name!r}, cpp_sources=[{cpp!r}], cuda_sources=[{cu!r}], functions=[{fn!r}],
                  build_directory={build!r}, extra_cflags=extra_cflags, extra_cuda_cflags=json.loads({cuflags!r}))
build_s = time.perf_counter() - tb
import torch
x = torch.randn(1000, device="cuda")
assert torch.equal(getattr(mod, {fn!r})(x), torch.relu(x))
print(json.dumps({{"build_s": build_s, "pch_s": pch_s, "total_s": time.perf_counter() - t0}}))
"""


def build_once(
    tag: str, root: Path, env_extra: dict[str, str], cflags: list[str], cuflags: list[str], use_pch: bool, cache: Path
) -> dict:
    build = root / f"build_{tag}"
    build.mkdir(parents=True)
    code = BUILD_SNIPPET.format(
        repo=str(REPO),
        cflags=json.dumps(cflags),
        cuflags=json.dumps(cuflags),
        use_pch=use_pch,
        cache=str(cache),
        name=f"probe_{tag}",
        cpp=CPP_SRC.replace("TAG", tag),
        cu=CUDA_SRC.replace("TAG", tag),
        fn=f"relu_{tag}",
        build=str(build),
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")} | env_extra
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        return {"tag": tag, "error": run.stderr[-3000:], "wall_s": wall}
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {"tag": tag, "wall_s": wall, **result, "build_dir": str(build)}


def ninja_nvcc(build_dir: Path) -> tuple[str, str, str]:
    """nvcc and the flags torch wrote into build.ninja for the .cu compile."""
    ninja = (build_dir / "build.ninja").read_text()
    flags = next(line.split("=", 1)[1] for line in ninja.splitlines() if line.startswith("cuda_cflags"))
    post = next((line.split("=", 1)[1] for line in ninja.splitlines() if line.startswith("cuda_post_cflags")), "")
    nvcc = next(line.split("=", 1)[1].strip() for line in ninja.splitlines() if line.startswith("nvcc"))
    return nvcc, flags, post


def nvcc_phases(build_dir: Path, out: Path) -> dict:
    """Re-run the .cu compile from build.ninja with `nvcc --time` for a per-phase breakdown."""
    nvcc, flags, post = ninja_nvcc(build_dir)
    csv = out / "nvcc_time.csv"
    cmd = [
        nvcc,
        *shlex.split(flags),
        *shlex.split(post),
        "--time",
        str(csv),
        "-c",
        str(build_dir / "cuda.cu"),
        "-o",
        str(build_dir / "probe_timed.cuda.o"),
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=False, capture_output=True)
    return {
        "nvcc_total_s": time.perf_counter() - t0,
        "phases": csv.read_text() if csv.exists() else "",
        "cmd": shlex.join(cmd),
    }


# The same kernel and wrapper behind lighter and lighter includes: how much of the .cu compile is torch's headers?
HEADER_VARIANTS = {
    "torch_extension": "#include <torch/extension.h>",
    "torch_types": "#include <torch/types.h>",
    "aten": "#include <ATen/ATen.h>",
    "aten_core_tensor": "#include <ATen/core/Tensor.h>\n#include <ATen/ops/empty_like.h>",
}
HEADER_BODY = r"""
__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
at::Tensor relu(const at::Tensor& x) {
    auto y = at::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
NO_TORCH = r"""
#include <cstdint>
__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" void relu_launch(const float* x, float* y, int64_t n) { relu_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
"""


def header_variants(build_dir: Path, out: Path) -> list[dict]:
    """Compile the .cu with torch's own nvcc flags from build.ninja, once per include set, all at once."""
    nvcc, flags, post = ninja_nvcc(build_dir)
    sources = {name: include + "\n" + HEADER_BODY for name, include in HEADER_VARIANTS.items()} | {"no_torch": NO_TORCH}
    out.mkdir(parents=True, exist_ok=True)

    def compile_one(name: str) -> dict:
        src = out / f"hdr_{name}.cu"
        src.write_text(sources[name])
        cmd = [nvcc, *shlex.split(flags), *shlex.split(post), "-c", str(src), "-o", str(out / f"hdr_{name}.o")]
        t0 = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return {
            "variant": name,
            "seconds": time.perf_counter() - t0,
            "ok": run.returncode == 0,
            "stderr": run.stderr[-1500:],
        }

    with ThreadPoolExecutor(len(sources)) as pool:
        return list(pool.map(compile_one, sources))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp()))
    ap.add_argument("--parallel", type=int, default=8, help="distinct extensions built at once in the last step")
    ap.add_argument("--headers-only", action="store_true", help="one build for the flags, then only the include sets")
    args = ap.parse_args()
    import torch

    from services.evaluator import pch

    arch = pch.device_arch(0)
    root = Path(tempfile.mkdtemp(prefix="probe_"))
    cache = root / "cache"
    ncpu = str(os.cpu_count())
    fast_env = {"TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": ncpu}
    rows = []
    if args.headers_only:
        base = build_once("arch", root, fast_env, ["-O3"], ["-O3"], False, cache)
        variants = header_variants(Path(base["build_dir"]), args.out) if "build_dir" in base else []
        result = {"device": torch.cuda.get_device_name(0), "arch": arch, "base": base, "headers": variants}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compile_headers.json").write_text(json.dumps(result, indent=1))
        for row in variants:
            print(f"{row['variant']:>18}: {row['seconds']:6.1f} s ok={row['ok']}", flush=True)
        return
    rows.append(build_once("default", root, {}, ["-O3"], ["-O3"], False, cache))
    rows.append(build_once("arch", root, fast_env, ["-O3"], ["-O3"], False, cache))
    rows.append(build_once("archpchcold", root, fast_env, ["-O3"], ["-O3"], True, cache))
    rows.append(build_once("archpch", root, fast_env, ["-O3"], ["-O3"], True, cache))
    rows.append(build_once("archpchO1", root, fast_env, ["-O3"], ["-O3", "-Xcompiler", "-O1"], True, cache))
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "build_dir"}), flush=True)
    phases = nvcc_phases(Path(rows[1]["build_dir"]), args.out) if "build_dir" in rows[1] else {}
    print(phases.get("phases", ""), flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        par = list(
            pool.map(
                lambda i: build_once(f"par{i}", root, fast_env, ["-O3"], ["-O3"], True, cache), range(args.parallel)
            )
        )
    par_wall = time.perf_counter() - t0
    summary = {
        "device": torch.cuda.get_device_name(0),
        "arch": arch,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "rows": rows,
        "nvcc": phases,
        "parallel": par,
        "parallel_wall_s": par_wall,
        "parallel_median_build_s": statistics.median(r.get("build_s", float("nan")) for r in par),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_probe.json").write_text(json.dumps(summary, indent=1))
    print(f"parallel x{args.parallel}: wall {par_wall:.1f} s, median build {summary['parallel_median_build_s']:.1f} s")


if __name__ == "__main__":
    main()
