"""Source generation for a fused element-wise kernel: C++ (CPU), CUDA and Triton, from the IR in `ewir`."""

from __future__ import annotations

import hashlib

from services.implementer.rules.ewir import Node

GELU_TANH_COEFF = 0.7978845608028654  # sqrt(2 / pi)
INV_SQRT2 = 0.7071067811865476

# C-family expression per op; the same text compiles as C++ (with `using std::...`) and as CUDA device code.
C_OPS = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "div": "{0} / {1}",
    "neg": "-{0}",
    "relu": "({0} < acc_t(0) ? acc_t(0) : {0})",
    "sigmoid": "acc_t(1) / (acc_t(1) + exp(-{0}))",
    "tanh": "ka_tanh({0})",
    "exp": "exp({0})",
    "log": "log({0})",
    "abs": "fabs({0})",
    "erf": "erf({0})",
    "sqrt": "sqrt({0})",
    "rsqrt": "acc_t(1) / sqrt({0})",
    "silu": "{0} / (acc_t(1) + exp(-{0}))",
    "gelu": f"acc_t(0.5) * {{0}} * (acc_t(1) + erf({{0}} * acc_t({INV_SQRT2!r})))",
    "gelu_tanh": f"acc_t(0.5) * {{0}} * (acc_t(1) + ka_tanh(acc_t({GELU_TANH_COEFF!r}) * ({{0}} + acc_t(0.044715) * {{0}} * {{0}} * {{0}})))",
}
TRITON_OPS = {
    **{k: C_OPS[k] for k in ("add", "sub", "mul", "div", "neg")},
    "relu": "tl.where({0} < 0.0, 0.0, {0})",
    "sigmoid": "tl.sigmoid({0})",
    "tanh": "2.0 * tl.sigmoid(2.0 * {0}) - 1.0",
    "exp": "tl.exp({0})",
    "log": "tl.log({0})",
    "abs": "tl.abs({0})",
    "erf": "tl.math.erf({0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})",
    "silu": "{0} * tl.sigmoid({0})",
    "gelu": f"0.5 * {{0}} * (1.0 + tl.math.erf({{0}} * {INV_SQRT2!r}))",
    "gelu_tanh": f"0.5 * {{0}} * (1.0 + (2.0 * tl.sigmoid(2.0 * {GELU_TANH_COEFF!r} * ({{0}} + 0.044715 * {{0}} * {{0}} * {{0}}))) - 1.0))",
}


def _lines(node: Node, ops: dict[str, str], literal, names: dict[Node, str], out: list[str]) -> str:
    """Emit one `tK = ...` line per distinct node (shared sub-trees once) and return the node's name."""
    kind = node[0]
    if kind == "in":
        return "v"
    if kind == "const":
        return literal(node[1])
    if kind == "scalar":
        return f"s{node[1]}"
    if node in names:
        return names[node]
    if kind == "clamp":
        value = _lines(node[1], ops, literal, names, out)
        expr = value
        if node[2] is not None:
            low = _lines(node[2], ops, literal, names, out)
            expr = f"({expr} < {low} ? {low} : {expr})" if ops is C_OPS else f"tl.where({expr} < {low}, {low}, {expr})"
        if node[3] is not None:
            out.append(f"t{len(names)}a = {expr}")
            clamped_low = f"t{len(names)}a"
            high = _lines(node[3], ops, literal, names, out)
            expr = (
                f"({clamped_low} > {high} ? {high} : {clamped_low})"
                if ops is C_OPS
                else f"tl.where({clamped_low} > {high}, {high}, {clamped_low})"
            )
    elif kind == "pow":
        base = _lines(node[1], ops, literal, names, out)
        product = " * ".join([base] * abs(node[2]))
        expr = product if node[2] > 0 else f"{literal(1.0)} / ({product})"
    else:
        operands = [_lines(child, ops, literal, names, out) for child in node[1:]]
        expr = ops[kind].format(*operands)
    name = f"t{len(names)}"
    names[node] = name
    out.append(f"{name} = {expr}")
    return name


def c_body(node: Node) -> tuple[list[str], str]:
    out: list[str] = []
    result = _lines(node, C_OPS, lambda v: f"acc_t({v!r})", {}, out)
    return [f"const acc_t {line};" for line in out], result


def triton_body(node: Node) -> tuple[list[str], str]:
    out: list[str] = []
    result = _lines(node, TRITON_OPS, repr, {}, out)
    return out, result


def kernel_id(node: Node, target: str) -> str:
    return hashlib.sha256(f"{target}:{node!r}".encode()).hexdigest()[:10]


def _scalar_params(count: int, c_type: str) -> str:
    return "".join(f", {c_type} s{i}_arg" for i in range(count))


def _scalar_casts(count: int, indent: str) -> str:
    return "".join(f"{indent}const acc_t s{i} = static_cast<acc_t>(s{i}_arg);\n" for i in range(count))


CPP_TEMPLATE = """#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <cmath>

using std::erf; using std::exp; using std::fabs; using std::log; using std::sqrt;

// glibc's scalar tanhf is several times slower than expf; this form is exact to float rounding for |x| > 1e-3
// and within 1e-7 absolute below.
template <typename T>
static inline T ka_tanh(T x) {{ return T(1) - T(2) / (exp(T(2) * x) + T(1)); }}

template <typename scalar_t>
static void fused_range(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t begin, int64_t end{params}) {{
  using acc_t = at::opmath_type<scalar_t>;
{casts}  #pragma omp simd
  for (int64_t i = begin; i < end; ++i) {{
    const acc_t v = static_cast<acc_t>(in[i]);
{body}
    out[i] = static_cast<scalar_t>({result});
  }}
}}

torch::Tensor fused_forward(torch::Tensor x{params}) {{
  TORCH_CHECK(!x.is_cuda(), "this build is the CPU kernel");
  auto input = x.contiguous();
  auto output = torch::empty_like(input);
  const int64_t n = input.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "fused_forward", [&] {{
    const scalar_t* in = input.data_ptr<scalar_t>();
    scalar_t* out = output.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {{
      fused_range<scalar_t>(in, out, begin, end{args});
    }});
  }});
  return output;
}}
"""

CUDA_TEMPLATE = """#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

template <typename T>
__device__ __forceinline__ T ka_tanh(T x) {{ return tanh(x); }}

template <typename scalar_t>
__global__ void fused_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t n{kernel_params}) {{
  // ATen's opmath_type without naming it: float for Half and BFloat16 (their sum with a float is one), the type
  // itself for float and double. Device code that names no torch type but Half/BFloat16 can be built apart from
  // the torch wrapper (the evaluator's split builds).
  using acc_t = decltype(scalar_t() + 0.0f);
{casts}  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {{
    const acc_t v = static_cast<acc_t>(in[i]);
{body}
    out[i] = static_cast<scalar_t>({result});
  }}
}}

torch::Tensor fused_forward(torch::Tensor x{params}) {{
  TORCH_CHECK(x.is_cuda(), "this build is the CUDA kernel");
  auto input = x.contiguous();
  auto output = torch::empty_like(input);
  const int64_t n = input.numel();
  if (n == 0) return output;
  const int threads = 256;
  const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "fused_forward", [&] {{
    fused_kernel<scalar_t><<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(), n{args});
  }});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return output;
}}
"""


def cpp_source(node: Node, scalars: int) -> str:
    body, result = c_body(node)
    return CPP_TEMPLATE.format(
        params=_scalar_params(scalars, "double"),
        casts=_scalar_casts(scalars, "  "),
        body="\n".join("    " + line for line in body),
        result=result,
        args="".join(f", s{i}_arg" for i in range(scalars)),
    )


def cuda_source(node: Node, scalars: int) -> str:
    body, result = c_body(node)
    return CUDA_TEMPLATE.format(
        kernel_params=_scalar_params(scalars, "double"),
        params=_scalar_params(scalars, "double"),
        casts=_scalar_casts(scalars, "  "),
        body="\n".join("    " + line for line in body),
        result=result,
        args="".join(f", s{i}_arg" for i in range(scalars)),
    )


def cuda_declaration(scalars: int) -> str:
    return f"torch::Tensor fused_forward(torch::Tensor x{_scalar_params(scalars, 'double')});"


def triton_kernel(name: str, node: Node, scalars: int) -> str:
    body, result = triton_body(node)
    params = "".join(f", s{i}" for i in range(scalars))
    lines = "\n".join("    " + line for line in body)
    return (
        f"@triton.jit\ndef {name}(in_ptr, out_ptr, n{params}, BLOCK: tl.constexpr):\n"
        "    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    mask = offsets < n\n"
        "    v = tl.load(in_ptr + offsets, mask=mask).to(tl.float32)\n"
        f"{lines}\n"
        f"    tl.store(out_ptr + offsets, ({result}).to(out_ptr.dtype.element_ty), mask=mask)\n"
    )
