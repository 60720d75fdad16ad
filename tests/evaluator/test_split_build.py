"""The split build's splitter and code generation (split_build.py) over the CUDA corpus, its hook in build_cache,
and real compiles of split outputs with nvcc and g++ where nvcc is installed (no GPU needed)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tree_sitter_cuda")

from services.evaluator import build_cache, split_build  # noqa: E402
from tests.evaluator import cuda_corpus  # noqa: E402

# Candidates the splitter must leave to the whole build, and why.
WHOLE = {
    "c34_compile_error_syntax": "parser",
    "c37_compile_error_missing_declaration": "do not declare",
    "c38_compile_error_device_calls_host": "names host code",
    "c44_packed_accessor": "uses torch",
    "c47_cublas_only": "no kernel launch",
    "c49_dispatch_in_host_template": "host template",
    "c50_deduced_template": "template arguments",
}


def _arguments(case: cuda_corpus.Case) -> dict[str, Any]:
    """The arguments as the builder gets them: parse_request's view, with the evaluator's flags merged in."""
    (call,) = cuda_corpus.load_inline_calls(case.source)
    arguments = {k: v for k, v in call.items() if k not in build_cache.NON_KEY_ARGS}
    build_cache._merge_flags(arguments, "cuda")
    return arguments


@pytest.fixture(scope="module")
def corpus() -> list[tuple[cuda_corpus.Case, dict[str, Any]]]:
    return [(case, _arguments(case)) for case in cuda_corpus.cases()]


def _plan(corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]], name: str) -> split_build.SplitPlan:
    arguments = next(a for c, a in corpus if c.name == name)
    return split_build.make_plan(arguments)


def test_corpus_covers_the_styles_and_verdicts(corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]]) -> None:
    assert len(corpus) >= 40
    expects = {case.expect for case, _ in corpus}
    assert expects == set(cuda_corpus.VERDICTS)
    text = "\n".join(case.source for case, _ in corpus)
    for style in ("AT_DISPATCH_FLOATING_TYPES_AND_HALF", "__shfl", "float4", "__constant__", "cudaStream_t",
                  "cublasSgemm", "__nv_bfloat16", "__half", "extern __shared__", "torch::matmul"):  # fmt: skip
        assert style in text, style
    assert any(len(a["functions"]) > 1 for _, a in corpus if isinstance(a["functions"], list))


def test_splitter_accepts_most_of_the_corpus_and_refuses_what_it_cannot_see(
    corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]],
) -> None:
    outcomes = {case.name: split_build.try_plan(arguments) for case, arguments in corpus}
    refused = {name: reason for name, (plan, reason) in outcomes.items() if plan is None}
    assert set(refused) == set(WHOLE), refused
    for name, reason in refused.items():
        assert WHOLE[name] in reason, (name, reason)
    assert len(outcomes) - len(refused) >= 0.8 * len(outcomes)


def test_every_plan_keeps_torch_out_of_device_code_and_launches_out_of_host_code(
    corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]],
) -> None:
    for case, arguments in corpus:
        plan, _ = split_build.try_plan(arguments)
        if plan is None:
            continue
        device_includes = re.findall(r"#\s*include\s*[<\"]([^>\"]+)", plan.device_source)
        torch_includes = {i for i in device_includes if i.split("/")[0] in ("torch", "ATen", "c10", "pybind11")}
        assert torch_includes <= {"c10/util/Half.h", "c10/util/BFloat16.h"}, case.name
        assert "<<<" not in plan.host_source, case.name
        assert plan.host_source.count("ka_launch_") >= plan.launch_sites, case.name
        assert plan.device_source.count('extern "C" void ka_launch_') >= plan.launch_sites, case.name
        assert "torch/extension.h" not in plan.host_source, case.name
        assert plan.binding_source.startswith(split_build.BINDING_PRELUDE), case.name


def test_dispatched_launch_gets_one_launcher_per_type(corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]]) -> None:
    plan = _plan(corpus, "c03_half_relu_dispatch")
    assert re.findall(r"void (ka_launch_0_\w+)\(", plan.device_source) == [
        "ka_launch_0_double",
        "ka_launch_0_float",
        "ka_launch_0_Half",
    ]
    assert "relu_kernel<c10::Half><<<ka_grid, ka_block, ka_shared, ka_stream>>>" in plan.device_source
    assert "#include <c10/util/Half.h>" in plan.device_source
    assert "ka_launch_0<scalar_t>(blocks, threads, 0, stream, in.data_ptr<scalar_t>()" in plan.host_source
    both = _plan(corpus, "c33_reduced_dispatch_half_bf16")
    assert len(re.findall(r'extern "C" void ka_launch_0_', both.device_source)) == 4
    assert "ka_launch_0_BFloat16" in both.device_source
    reduced = _plan(corpus, "c54_relu_reduced_types")
    assert re.findall(r"void (ka_launch_0_\w+)\(", reduced.device_source) == [
        "ka_launch_0_Half",
        "ka_launch_0_BFloat16",
    ]


def test_launch_configurations_and_template_constants(corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]]) -> None:
    # Two-argument launches get no shared memory and the default stream, as <<<g, b>>> does.
    plan = _plan(corpus, "c01_relu_basic")
    assert "ka_launch_0(blocks, threads, 0, 0, input.data_ptr<float>()" in plan.host_source
    assert "#define CHECK_INPUT" in plan.device_source  # macros go to both sides
    tiled = _plan(corpus, "c17_matmul_template_tile")
    assert "matmul_kernel<kTile><<<" in tiled.device_source
    assert "constexpr int kTile = 32;" in tiled.device_source and "constexpr int kTile = 32;" in tiled.host_source
    streams = _plan(corpus, "c26_relu_two_streams")
    assert streams.launch_sites == 2
    assert "ka_launch_1((n - half + 255) / 256, 256, 0, streams[1], xp + half, yp + half, n - half)" in (
        streams.host_source
    )


def test_a_struct_keeps_its_semicolon_on_both_sides(corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]]) -> None:
    plan = _plan(corpus, "c30_functor_template")
    for source in (plan.device_source, plan.host_source):
        assert re.search(r"struct SigmoidOp \{.*?\n\};\n", source, re.DOTALL), source


def test_namespaces_guards_and_kernel_addresses(corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]]) -> None:
    anonymous = _plan(corpus, "c45_anonymous_namespace")
    assert re.search(r"namespace \{\n__global__ void swish_kernel.*?\n\}\n\}\n", anonymous.device_source, re.DOTALL)
    guarded = _plan(corpus, "c46_preprocessor_guard")
    for source in (guarded.device_source, guarded.host_source):
        assert "#ifndef BLOCK_SIZE\n#define BLOCK_SIZE 256\n#endif" in source
    attribute = _plan(corpus, "c48_func_attribute")
    assert "cudaFuncSetAttribute(ka_kernel_softmax_row_kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize" in (
        attribute.host_source
    )
    assert "return (const void*)softmax_row_kernel;" in attribute.device_source
    plan = split_build.make_plan(
        {
            "cpp_sources": "void f(torch::Tensor y);",
            "cuda_sources": "namespace ops {\n__constant__ float c;\n__global__ void k(float* y) { y[0] = c; }\n"
            "void f(torch::Tensor y) { float v = 1; cudaMemcpyToSymbol(c, &v, 4); k<<<1, 1>>>(y.data_ptr<float>()); }\n"
            "}\n",
            "functions": ["f"],
        }
    )
    assert "ops::k<<<ka_grid" in plan.device_source and "return (const void*)&ops::c;" in plan.device_source
    using = _plan(corpus, "c28_functions_dict")
    assert "using namespace torch;" not in using.device_source and "using namespace torch;" in using.host_source
    # Device-only libraries (empty or broken under g++) stay on the device side.
    groups = _plan(corpus, "c51_cooperative_groups_reduce")
    assert "cooperative_groups" not in groups.host_source
    assert "namespace cg = cooperative_groups;" in groups.device_source


@pytest.mark.parametrize(
    "cuda",
    [
        "#ifdef FAST\n__global__ void k(float* y) { y[0] = 1; }\n#endif\n",
        "#ifndef B\n#define B 1\n#else\n#define B 2\n#endif\n__global__ void k(float* y) { y[0] = B; }\n",
        "namespace ops { __global__ void k(float* y) { y[0] = 1; } }\n",
        "#define B 1\n__global__ void k(float* y) { y[0] = B; }\n#undef B\n#define B 2\n",
        "#define B 1\n__global__ void k(float* y) { y[0] = B; }\n#define B 2\n",
    ],
)
def test_conditionals_around_code_and_qualified_launches_are_refused(cuda: str) -> None:
    host = (
        "void f(torch::Tensor y) { ops::k<<<1, 1>>>(y.data_ptr<float>()); }\n"
        if "namespace" in cuda
        else ("void f(torch::Tensor y) { k<<<1, 1>>>(y.data_ptr<float>()); }\n")
    )
    plan, why = split_build.try_plan({"cpp_sources": "void f(torch::Tensor y);", "cuda_sources": cuda + host,
                                      "functions": ["f"]})  # fmt: skip
    assert plan is None, cuda
    assert why


def test_constant_memory_is_reached_through_an_accessor(
    corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]],
) -> None:
    plan = _plan(corpus, "c11_polynomial_constant_array")
    assert "cudaMemcpyToSymbolAsync(ka_symbol_d_coeffs(), host," in plan.host_source
    assert 'extern "C" const void* ka_symbol_d_coeffs() { return (const void*)&d_coeffs; }' in plan.device_source
    assert "__constant__" not in plan.host_source


def test_host_device_helpers_and_wrappers_in_cpp_sources(
    corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]],
) -> None:
    helper = _plan(corpus, "c29_host_device_helper")
    assert "inline int ceil_div" in helper.host_source and "inline int ceil_div" in helper.device_source
    assert "gelu_exact" not in helper.host_source
    wrapper = _plan(corpus, "c31_wrapper_in_cpp_sources")
    assert "torch::Tensor relu(torch::Tensor x) {" in wrapper.host_source  # the definition from cpp_sources
    assert wrapper.host_source.index("void launch_relu(const float* x, float* y, int n);") < wrapper.host_source.index(
        "torch::Tensor relu(torch::Tensor x) {"
    )
    # Its signature, as tokens, in the binding; the table that reaches it after its definition in the host code.
    assert "torch :: Tensor ka_split_signature_0 ( torch :: Tensor ) ;" in wrapper.binding_source
    assert wrapper.host_source.index("torch::Tensor relu(torch::Tensor x) {") < wrapper.host_source.index(
        "decltype(&ka_split_signature_0) ka_split_function_0 = &relu;"
    )


def test_binding_is_what_load_inline_generates_for_the_signatures_alone() -> None:
    """The binding binds each function (with torch's error handling unless turned off) under the name and docstring
    the host code's table gives; its key ignores layout, the functions' names and their parameters' names, not
    their types."""
    cuda = "__global__ void k(float* y) { y[0] = 1; }\nvoid f(torch::Tensor y) { k<<<1, 1>>>(y.data_ptr<float>()); }\n"
    arguments = {"cpp_sources": "void f(torch::Tensor y);", "cuda_sources": cuda, "functions": {"f": "doc of f"}}
    plan = split_build.make_plan(arguments)
    assert "m.def(ka_split_names[0], torch::wrap_pybind_function(ka_split_function_0), ka_split_docs[0]);" in (
        plan.binding_source
    )
    assert f"PYBIND11_MODULE({split_build.BINDING_INIT}, m)" in plan.binding_source
    assert '"f"' not in plan.binding_source and "doc of f" not in plan.binding_source
    assert 'ka_split_names[] = {"f"};' in plan.host_source and 'ka_split_docs[] = {"doc of f"};' in plan.host_source
    raw = split_build.make_plan({**arguments, "with_pytorch_error_handling": False})
    assert "m.def(ka_split_names[0], ka_split_function_0, ka_split_docs[0]);" in raw.binding_source

    def key(**changes: Any) -> str:
        return split_build.binding_key(split_build.make_plan({**arguments, **changes}).binding_source, "s")

    assert key(cpp_sources="// the wrapper\nvoid   f(torch::Tensor y) ;\n") == key()
    renamed = cuda.replace("void f(torch::Tensor y)", "void g(torch::Tensor input)")
    assert key(cpp_sources="void g(torch::Tensor input);", cuda_sources=renamed, functions={"g": "other"}) == key()
    assert key(cpp_sources="void f(at::Tensor y);") != key()
    assert key(with_pytorch_error_handling=False) != key()


@pytest.mark.parametrize(
    ("cpp_sources", "reason"),
    [
        ("void f(torch::Tensor y), g(int);", "several functions"),
        # load_inline's binding cannot take an overloaded name; the split's table would pick one.
        ("void f(torch::Tensor y);\nvoid f(torch::Tensor y, int64_t k);", "declared twice with other signatures"),
        # Found beside the first library built: a binding shared by the same text would depend on it.
        ('#include "helpers.h"\nvoid f(torch::Tensor y);', "other than <...>"),
        ("#define HEADER <vector>\n#include HEADER\nvoid f(torch::Tensor y);", "other than <...>"),
    ],
)
def test_cpp_sources_a_shared_binding_cannot_serve_take_the_whole_build(cpp_sources: str, reason: str) -> None:
    cuda = "__global__ void k(float* y) { y[0] = 1; }\nvoid f(torch::Tensor y) { k<<<1, 1>>>(y.data_ptr<float>()); }\n"
    arguments = {"cpp_sources": cpp_sources, "cuda_sources": cuda, "functions": ["f"]}
    plan, why = split_build.try_plan(arguments)
    assert plan is None and reason in why, why


def test_a_declaration_and_the_definition_of_a_bound_function_share_a_signature() -> None:
    cuda = "__global__ void k(float* y) { y[0] = 1; }\nvoid launch(float* y) { k<<<1, 1>>>(y); }\n"
    cpp = "void launch(float* y);\nvoid f(torch::Tensor y);\nvoid f(torch::Tensor x) { launch(x.data_ptr<float>()); }"
    plan, why = split_build.try_plan({"cpp_sources": cpp, "cuda_sources": cuda, "functions": ["f"]})
    assert plan is not None, why


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"extra_cuda_cflags": ["-DFAST=1"]}, "flag"),
        ({"extra_cuda_cflags": ["-Xcompiler", "-fopenmp"]}, "flag"),
        ({"extra_cflags": ["-ffast-math"]}, "flag"),
        ({"extra_ldflags": ["-Wl,--wrap=malloc"]}, "flag"),
        ({"extra_include_paths": ["/tmp"]}, "include paths"),
        ({"functions": None}, "no functions"),
        ({"is_python_module": False}, "python module"),
        ({"cpp_sources": "void f(torch::Tensor y);\nPYBIND11_MODULE(x, m) {}"}, "bind on their own"),
    ],
)
def test_arguments_the_split_does_not_reproduce_take_the_whole_build(change: dict[str, Any], reason: str) -> None:
    cuda = "__global__ void k(float* y) { y[0] = 1; }\nvoid f(torch::Tensor y) { k<<<1, 1>>>(y.data_ptr<float>()); }\n"
    arguments = {"cpp_sources": "void f(torch::Tensor y);", "cuda_sources": cuda, "functions": ["f"], **change}
    plan, why = split_build.try_plan(arguments)
    assert plan is None and reason in why


def test_blank_flags_as_candidates_write_them_are_no_obstacle() -> None:
    cuda = "__global__ void k(float* y) { y[0] = 1; }\nvoid f(torch::Tensor y) { k<<<1, 1>>>(y.data_ptr<float>()); }\n"
    arguments = {"cpp_sources": "void f(torch::Tensor y);", "cuda_sources": cuda, "functions": ["f"]}
    plan, why = split_build.try_plan({**arguments, "extra_cflags": [""], "extra_ldflags": [""]})
    assert plan is not None, why


@pytest.mark.parametrize(
    "host",
    [
        'void f(torch::Tensor y) { asm volatile(""); k<<<1, 1>>>(y.data_ptr<float>()); }',
        "void f(torch::Tensor y) { auto p = &k; k<<<1, 1>>>(y.data_ptr<float>()); }",
        "void f(torch::Tensor y) { const int T = 4; t<T><<<1, 1>>>(y.data_ptr<float>()); }",
        "void f(torch::Tensor y) { t<scalar_t><<<1, 1>>>(y.data_ptr<float>()); }",
        "void f(torch::Tensor y) { k<<<1, 1>>>(y.data_ptr<float>(), 2); }",
    ],
)
def test_host_code_the_splitter_does_not_fully_understand_is_refused(host: str) -> None:
    cuda = (
        "__global__ void k(float* y) { y[0] = 1; }\n"
        "template <int N> __global__ void t(float* y) { y[0] = N; }\n"
        "const int T = 8;\n" + host + "\n"
    )
    plan, why = split_build.try_plan(
        {"cpp_sources": "void f(torch::Tensor y);", "cuda_sources": cuda, "functions": ["f"]}
    )
    assert plan is None, host
    assert why


def test_service_asks_for_a_split_only_when_enabled_and_publishes_only_the_expected_binding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    case = next(c for c in cuda_corpus.cases() if c.name == "c01_relu_basic")
    (call,) = cuda_corpus.load_inline_calls(case.source)
    event = {"kind": "load_inline", "arguments": call}

    def no_flags_in_the_service(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("torch's build flags need the GPU's arch; the service must not open a CUDA context")

    monkeypatch.setattr(build_cache.pch, "_ninja_cflags", no_flags_in_the_service)
    monkeypatch.setenv("EVALUATOR_SPLIT_BUILD", "off")
    _, off = build_cache.parse_request(event, "cuda")
    assert build_cache.SPLIT_ARGUMENT not in off
    monkeypatch.delenv("EVALUATOR_SPLIT_BUILD")  # the default
    _, on = build_cache.parse_request(event, "cuda")
    expected = on[build_cache.SPLIT_ARGUMENT]
    salt = split_build.binding_salt(tuple(build_cache.build_flags("cuda")["extra_cflags"]))
    assert expected == split_build.binding_key(split_build.make_plan(on).binding_source, salt)
    _, cpu = build_cache.parse_request(event, "cpu")
    assert build_cache.SPLIT_ARGUMENT not in cpu
    refused = {
        **call,
        "cuda_sources": call["cuda_sources"].replace("#include <cuda_runtime.h>", "#ifdef A\\nint a;\\n#endif"),
    }
    _, whole = build_cache.parse_request({"kind": "load_inline", "arguments": refused}, "cuda")
    assert build_cache.SPLIT_ARGUMENT not in whole

    key = build_cache.cache_key("load_inline", on, "arch")
    assert build_cache.cache_key("load_inline", off, "arch") != key
    cache_dir, root = tmp_path / "cache", tmp_path / "builder"
    build_cache.prepare(cache_dir)
    (root / "home" / "build").mkdir(parents=True)
    name = build_cache.library_name(key)
    forged = "f" * 64
    for filename in (f"{name}.so", f"split_binding_{expected}.o", f"split_binding_{forged}.o"):
        (root / "home" / "build" / filename).write_bytes(filename.encode())
    files = [f"{name}.so", f"split_binding_{expected}.o", f"split_binding_{forged}.o"]
    build_cache.publish(cache_dir, root, None, key, files, "split")
    stored = split_build.cached_binding(cache_dir, expected)
    assert stored is not None and stored.read_bytes() == f"split_binding_{expected}.o".encode()
    assert split_build.cached_binding(cache_dir, forged) is None
    assert not (cache_dir / key / f"split_binding_{expected}.o").exists()
    # A binding that cannot be read (here a link) is not kept, and the library is published all the same.
    _, again = build_cache.parse_request({"kind": "load_inline", "arguments": {**call, "name": "other"}}, "cuda")
    other_key = build_cache.cache_key("load_inline", {**again, "extra_cflags": ["-O2"]}, "arch")
    other_root = tmp_path / "other"
    (other_root / "home" / "build").mkdir(parents=True)
    other_name = build_cache.library_name(other_key)
    (other_root / "home" / "build" / f"{other_name}.so").write_bytes(b"so")
    (other_root / "home" / "build" / f"split_binding_{expected}.o").symlink_to("/etc/hostname")
    shutil.rmtree(cache_dir / split_build.BINDING_DIR)
    files = [f"{other_name}.so", f"split_binding_{expected}.o"]
    assert build_cache.publish(cache_dir, other_root, None, other_key, files, "split").read_bytes() == b"so"
    assert split_build.cached_binding(cache_dir, expected) is None


def test_a_failed_split_build_falls_back_to_the_whole_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("torch")

    def failing_split(*args: Any, **kwargs: Any) -> Any:
        (tmp_path / "build" / "split_device.cu").write_text("left behind")
        raise RuntimeError("split build failed: nvcc said no")

    whole_builds: list[dict[str, Any]] = []

    def whole(original: Any, arguments: dict[str, Any], kind: str, device: str, build_dir: Path) -> bool:
        whole_builds.append(arguments)
        (build_dir / f"{arguments['name']}.so").write_bytes(b"")
        return True

    monkeypatch.setattr(split_build, "build", failing_split)
    monkeypatch.setattr(build_cache, "compile_extension", whole)
    monkeypatch.setattr(build_cache.pch, "find_pch", lambda *a, **k: None)
    (tmp_path / "build").mkdir()
    arguments = {"cpp_sources": "", "cuda_sources": "", "functions": ["f"], build_cache.SPLIT_ARGUMENT: "0" * 64}
    built = build_cache.build({"kind": "load_inline", "arguments": arguments, "key": "k" * 64}, tmp_path / "build",
                              "cuda", tmp_path / "cache")  # fmt: skip
    assert len(whole_builds) == 1 and build_cache.SPLIT_ARGUMENT not in whole_builds[0]
    assert built.files == [f"{build_cache.library_name('k' * 64)}.so"]  # the split's files are gone
    assert built.build_path == "fallback" and set(built.parts_s) == {"split_discarded", "whole"}


# Real compiles: nvcc for the device file, g++ for the host file, as the split build's ninja file says. Only for
# candidates that need no CUDA library headers beyond the runtime's (this machine's toolkit may lack cuBLAS).
COMPILED = [
    "c01_relu_basic",
    "c11_polynomial_constant_array",
    "c21_row_sum_shared",
    "c30_functor_template",
    "c33_reduced_dispatch_half_bf16",
]


@pytest.fixture(scope="module")
def cuda_toolchain() -> None:
    torch = pytest.importorskip("torch")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    import torch.utils.cpp_extension as cpp_extension

    homes = [os.environ.get("CUDA_HOME"), "/usr/local/cuda", str(Path(os.path.realpath(nvcc)).parents[1])]
    cuda_home = next((h for h in homes if h and (Path(h) / "include" / "cuda_runtime.h").is_file()), None)
    if cuda_home is None:
        pytest.skip("no CUDA toolkit headers beside nvcc")
    patch = pytest.MonkeyPatch()
    if not torch.cuda.is_available():
        patch.setattr(cpp_extension, "CUDA_HOME", cuda_home)
        patch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    yield
    patch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED)
def test_split_sources_compile(
    name: str, corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]], cuda_toolchain: None, tmp_path: Path
) -> None:
    plan = _plan(corpus, name)
    objects, _ = split_build.write_ninja(plan, tmp_path, f"ext_{name[:3]}", tmp_path / "cache", ["-O3"])
    device = [o for o in objects if o.startswith("split_device")]
    # The host file once (torch/types.h without a PCH is the slow part on a CPU runner); the device file for each.
    targets = device + (
        [o for o in objects if o.startswith(("split_host", "split_stub"))] if name == COMPILED[0] else []
    )
    split_build.run_ninja(tmp_path, targets, timeout_s=900)  # a loaded CI runner is slow; the service's limit is less
    assert all((tmp_path / t).stat().st_size > 0 for t in targets)


@pytest.mark.slow
def test_stub_forwards_the_extensions_init_to_the_shared_binding(tmp_path: Path) -> None:
    """The cached binding's module init has a fixed name; each library's own PyInit_<name> forwards to it, and
    Python names the module after the library (pybind11 from torch's headers, no torch code)."""
    import subprocess
    import sysconfig

    pytest.importorskip("torch")
    from torch.utils import cpp_extension

    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    includes = [f"-I{p}" for p in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    (tmp_path / "binding.cpp").write_text(
        "#include <pybind11/pybind11.h>\nint twice(int x) { return 2 * x; }\n"
        f'PYBIND11_MODULE({split_build.BINDING_INIT}, m) {{ m.def("twice", &twice); }}\n'
    )
    (tmp_path / "stub.cpp").write_text(split_build.STUB_SOURCE)
    flags = [compiler, "-O0", "-fPIC", "-std=c++17", *includes, "-c"]
    subprocess.run([*flags, "binding.cpp", "-o", "binding.o"], cwd=tmp_path, check=True)
    subprocess.run([*flags, "-DTORCH_EXTENSION_NAME=ext_probe", "stub.cpp", "-o", "stub.o"], cwd=tmp_path, check=True)
    subprocess.run([compiler, "-shared", "stub.o", "binding.o", "-o", "ext_probe.so"], cwd=tmp_path, check=True)
    module = build_cache._load_library(tmp_path / "ext_probe.so", "ext_probe", True)
    assert module.__name__ == "ext_probe"
    assert module.twice(21) == 42


def test_the_stub_compiles_without_the_host_codes_pch(
    corpus: list[tuple[cuda_corpus.Case, dict[str, Any]]],
    cuda_toolchain: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host file is compiled against the types.h PCH; the stub, which includes nothing, is not (loading the PCH
    was most of its compile). Here the PCH path names no file: a stub given it would not compile."""
    import subprocess

    missing = tmp_path / "no-such-pch" / "types.h"
    monkeypatch.setattr(split_build.pch, "find_pch", lambda *args, **kwargs: missing)
    objects, _ = split_build.write_ninja(_plan(corpus, "c01_relu_basic"), tmp_path, "ext_stub", tmp_path, ["-O3"])
    host, stub = (next(o for o in objects if o.startswith(prefix)) for prefix in ("split_host", "split_stub"))

    def command(target: str) -> str:
        listed = subprocess.run(["ninja", "-t", "commands", "-s", target], cwd=tmp_path, capture_output=True, text=True)
        return listed.stdout

    assert str(missing) in command(host)
    stub_command = command(stub)
    assert str(missing) not in stub_command and "-DTORCH_EXTENSION_NAME=ext_stub" in stub_command
    split_build.run_ninja(tmp_path, [stub], timeout_s=120)
    assert (tmp_path / stub).stat().st_size > 0


@pytest.mark.slow
def test_one_generated_binding_serves_libraries_of_other_names(tmp_path: Path) -> None:
    """A binding as make_plan writes it (torch's pybind11 headers only, `torch::` as torch/types.h names it) for
    declarations of the kinds candidates write, compiled once against the CPU torch and linked with the host code
    and stub of two libraries whose functions and parameters have other names: each module has its own functions,
    every one takes and returns what load_inline's own binding would (tensors, a list of tensors, an optional
    tensor, ints, floats, bools), and a failed TORCH_CHECK is a Python RuntimeError. A function whose type the
    binding's declaration does not have is refused at compile time."""
    import subprocess

    torch = pytest.importorskip("torch")
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    declarations = (
        "#include <vector>\n"
        "torch::Tensor scaled(torch::Tensor x, double scale, int64_t offset);\n"
        "std::vector<torch::Tensor> split_halves(const torch::Tensor& x, bool flip);\n"
        "torch::Tensor maybe_add(torch::Tensor x, c10::optional<torch::Tensor> bias, int repeat);\n"
    )
    definitions = """
torch::Tensor scaled(torch::Tensor x, double scale, int64_t offset) { return x * scale + offset; }
std::vector<torch::Tensor> split_halves(const torch::Tensor& x, bool flip) {
    auto parts = x.chunk(2);
    return flip ? std::vector<torch::Tensor>{parts[1], parts[0]} : std::vector<torch::Tensor>{parts[0], parts[1]};
}
torch::Tensor maybe_add(torch::Tensor x, c10::optional<torch::Tensor> bias, int repeat) {
    TORCH_CHECK(repeat > 0, "repeat must be positive");
    for (int i = 0; i < repeat; ++i) x = bias.has_value() ? x + *bias : x;
    return x;
}
"""
    renames = {"scaled": "affine", "split_halves": "halves", "maybe_add": "add_bias", "x": "input", "flip": "swap"}
    libraries = {}
    for library, names in (("ext_bound", {}), ("ext_renamed", renames)):
        sources = [declarations, definitions]
        for old, new in names.items():
            sources = [re.sub(rf"\b{old}\b", new, text) for text in sources]
        functions = {names.get(f, f): f"doc {f}" for f in ("scaled", "split_halves", "maybe_add")}
        binding, _, table, declared = split_build._binding(sources[0], functions, pytorch_errors=True)
        assert declared == set(functions) and "torch/extension.h" not in binding
        libraries[library] = (binding, "#include <torch/types.h>\n" + "".join(sources) + table)
    assert libraries["ext_bound"][0] == libraries["ext_renamed"][0]  # one binding for both
    (tmp_path / "binding.cpp").write_text(libraries["ext_bound"][0])
    (tmp_path / "stub.cpp").write_text(split_build.STUB_SOURCE)
    from services.evaluator import pch

    cflags = pch._ninja_cflags([], with_cuda=False)
    assert cflags is not None
    compile_ = ["c++", *cflags, "-c"]
    builds = [[*compile_, f"-DTORCH_EXTENSION_NAME={split_build.BINDING_INIT}", "binding.cpp", "-o", "binding.o"]]
    for library, (_, host) in libraries.items():
        (tmp_path / f"{library}_host.cpp").write_text(host)
        builds.append([*compile_, f"{library}_host.cpp", "-o", f"{library}_host.o"])
        builds.append([*compile_, f"-DTORCH_EXTENSION_NAME={library}", "stub.cpp", "-o", f"{library}_stub.o"])
    # A function whose type is not the binding's declaration (as if leaving out its parameters' names had changed
    # their types): the table's pointer, of the binding's type, does not take it, and there is no library.
    _, _, odd_table, _ = split_build._binding("torch::Tensor odd(torch::Tensor x);", {"odd": ""}, pytorch_errors=True)
    odd = "torch::Tensor odd(torch::Tensor x, double scale) { return x * scale; }\n"
    (tmp_path / "mismatch_host.cpp").write_text("#include <torch/types.h>\n" + odd + odd_table)
    refused = subprocess.Popen([*compile_, "mismatch_host.cpp", "-o", "mismatch_host.o"], cwd=tmp_path)
    running = [subprocess.Popen(b, cwd=tmp_path, stderr=subprocess.PIPE, text=True) for b in builds]
    for process in running:
        assert process.wait() == 0, process.stderr.read() if process.stderr else ""
    assert refused.wait() != 0
    from torch.utils import cpp_extension

    linked = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    modules = {}
    for library in libraries:
        objects = [f"{library}_stub.o", "binding.o", f"{library}_host.o"]
        subprocess.run(["c++", "-shared", *objects, *linked, "-o", f"{library}.so"], cwd=tmp_path, check=True)
        modules[library] = build_cache._load_library(tmp_path / f"{library}.so", library, True)
    # A host file whose reading of a signature is another (a float where the binding has a double): the pointer
    # links (a variable's symbol holds no type), but the binding's check of the types, a hidden function whose
    # mangled name holds them, is not defined there, and the link fails.
    other = [text.replace("double scale", "float scale") for text in (declarations, definitions)]
    bound = dict.fromkeys(("scaled", "split_halves", "maybe_add"), "")
    _, _, other_table, _ = split_build._binding(other[0], bound, pytorch_errors=True)
    (tmp_path / "other_host.cpp").write_text("#include <torch/types.h>\n" + "".join(other) + other_table)
    subprocess.run([*compile_, "other_host.cpp", "-o", "other_host.o"], cwd=tmp_path, check=True)
    objects = ["ext_bound_stub.o", "binding.o", "other_host.o"]
    link = ["c++", "-shared", *objects, *linked, "-o", "other.so"]
    mislinked = subprocess.run(link, cwd=tmp_path, capture_output=True, text=True)
    assert mislinked.returncode != 0 and "ka_split_type_0" in mislinked.stderr, mislinked.stderr
    x = torch.arange(6.0)
    for module, names in ((modules["ext_bound"], {}), (modules["ext_renamed"], renames)):
        scaled, split_halves, maybe_add = (
            getattr(module, names.get(f, f)) for f in ("scaled", "split_halves", "maybe_add")
        )
        assert not hasattr(module, "scaled" if names else "affine")
        assert scaled.__doc__.strip().endswith("doc scaled")
        assert torch.equal(scaled(x, 2.0, 1), x * 2 + 1)
        first, second = split_halves(x, True)
        assert torch.equal(first, x[3:]) and torch.equal(second, x[:3])
        assert torch.equal(maybe_add(x, None, 1), x) and torch.equal(maybe_add(x, x, 2), 3 * x)
        with pytest.raises(RuntimeError, match="repeat must be positive"):
            maybe_add(x, x, 0)
        with pytest.raises(TypeError):
            scaled(x, "two", 1)


def test_deeply_nested_sources_are_no_danger_to_the_service() -> None:
    deep = "(" * 20_000 + "1" + ")" * 20_000
    cuda = f"__global__ void k(float* y) {{ y[0] = {deep}; }}\nvoid f(torch::Tensor y) {{ k<<<1, 1>>>(y.data_ptr<float>()); }}\n"
    plan, why = split_build.try_plan(
        {"cpp_sources": "void f(torch::Tensor y);", "cuda_sources": cuda, "functions": ["f"]}
    )
    assert plan is not None or why
    assert split_build.expected_binding({"cpp_sources": "", "cuda_sources": cuda, "functions": ["f"]}, ["-O3"]) is None


def test_the_types_header_pch_has_a_key_of_its_own_and_the_extension_ones_keep_theirs() -> None:
    pytest.importorskip("torch")
    from services.evaluator import pch

    extension = pch.pch_key(["-O3"], "c++")
    assert pch.pch_key(["-O3"], "c++", "torch/extension.h") == extension  # caches built before keep their PCH
    assert pch.pch_key(["-O3"], "c++", pch.TYPES_HEADER) != extension


def test_a_split_build_past_its_time_is_stopped_with_its_compilers(tmp_path: Path) -> None:
    import time

    import psutil

    command = "sh -c 'echo $$$$ > compiler.pid; exec sleep 30'"  # ninja reads $$ as $
    (tmp_path / "build.ninja").write_text(f"rule slow\n  command = {command}\nbuild out: slow\n")
    with pytest.raises(RuntimeError, match="longer than"):
        split_build.run_ninja(tmp_path, [], timeout_s=2)
    pid = int((tmp_path / "compiler.pid").read_text())
    time.sleep(0.5)
    try:
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


def test_each_part_of_a_split_build_is_timed_from_ninjas_log(tmp_path: Path) -> None:
    """The builder's part timings come from ninja's own log of the build it ran, not from any compiled code."""
    (tmp_path / "build.ninja").write_text(
        "rule slow\n  command = sleep 0.3 && touch $out\nrule quick\n  command = touch $out\n"
        "build split_device.cuda.o: slow\nbuild split_host.o: quick\nbuild split_binding_" + "a" * 64 + ".o: quick\n"
        "build ext_k.so: slow split_device.cuda.o split_host.o\nbuild other.o: quick\n"
    )
    split_build.run_ninja(tmp_path, [])
    parts = split_build.ninja_part_seconds(tmp_path)
    assert set(parts) == {"device", "host", "binding", "link"}
    assert parts["device"] >= 0.3 and parts["link"] >= 0.3 and parts["host"] < 0.3
    (tmp_path / ".ninja_log").write_text("# ninja log v5\nnot\ta\tline\n12\t7\t0\tsplit_stub.o\th\n")
    assert split_build.ninja_part_seconds(tmp_path) == {"stub": 0.0}
    (tmp_path / ".ninja_log").unlink()
    assert split_build.ninja_part_seconds(tmp_path) == {}


# The builtin implementer's fused element-wise kernels (target cuda), as the trainer's offline loop sends them.
BUILTIN_CUDA = ["scale_shift_clamp", "gelu_tanh_manual", "mish_manual", "elementwise_chain"]


def _builtin_cuda_arguments(problem: str) -> list[dict[str, Any]]:
    """The load_inline arguments of each CUDA kernel the builtin implementer writes for `problem` (the module's
    build is lazy, at the first call, so its source constants are read from the module's namespace)."""
    from problems import get_problem
    from services.implementer.rules import TECHNIQUES, rewrite

    technique = next(t for t in TECHNIQUES if t.name == "fuse_elementwise")
    result = rewrite(get_problem(f"builtin/{problem}", "cpu").source, technique.example, "cuda")
    assert result.applied == ["fuse_elementwise"], result.notes
    namespace: dict[str, Any] = {"__name__": "candidate"}
    exec(compile(result.source, "<candidate>", "exec"), namespace)  # our own generated code
    calls = []
    for name, cuda in namespace.items():
        if name.startswith("_FUSED_") and name.endswith("_CUDA"):
            arguments = {"name": "ka_fused_cuda", "cpp_sources": namespace[name[: -len("CUDA")] + "DECL"],
                         "cuda_sources": cuda, "functions": ["fused_forward"], "extra_cuda_cflags": ["-O3"]}  # fmt: skip
            build_cache._merge_flags(arguments, "cuda")
            calls.append(arguments)
    assert calls
    return calls


@pytest.mark.parametrize("problem", BUILTIN_CUDA)
def test_the_builtin_implementers_cuda_kernels_take_the_split_build(problem: str) -> None:
    for arguments in _builtin_cuda_arguments(problem):
        plan, reason = split_build.try_plan(arguments)
        assert plan is not None, reason
        assert plan.launch_sites == 1 and "fused_kernel<c10::BFloat16>" in plan.device_source


@pytest.mark.slow
def test_the_builtin_implementers_split_device_code_compiles(cuda_toolchain: None, tmp_path: Path) -> None:
    (arguments,) = _builtin_cuda_arguments("gelu_tanh_manual")
    plan = split_build.make_plan(arguments)
    objects, _ = split_build.write_ninja(plan, tmp_path, "ext_builtin", tmp_path / "cache", ["-O3"])
    device = [o for o in objects if o.startswith("split_device")]
    split_build.run_ninja(tmp_path, device, timeout_s=900)
    assert all((tmp_path / o).stat().st_size > 0 for o in device)
