"""Techniques that change how forward runs, not what it computes: torch.compile, CUDA graphs, autocast, TF32,
cudnn.benchmark and channels-last.

They share one generated layer around the computation (kept in `_forward_impl`): `forward` -> CUDA-graph replay
(CUDA inputs only) -> scoped backend flags / autocast / channels-last inputs -> torch.compile -> `_forward_impl`.
The layer is regenerated from the set of techniques applied so far, so applying one twice, or in any turn order,
gives the same code. Backend flags are set for the call and restored afterwards, so the reference model that
runs in the same process is not affected.
"""

from __future__ import annotations

import ast

from services.implementer.rules.astutil import IMPL_METHOD, canonical, method, param_names, parse_stmts, remove_method
from services.implementer.rules.base import Context

LAYER_ORDER = ("channels_last", "half_precision", "tf32", "cudnn_benchmark", "torch_compile", "cuda_graphs")
CONFIG_TECHNIQUES = frozenset({"channels_last", "half_precision", "tf32", "cudnn_benchmark"})
LAYER_METHODS = ("forward", "_forward_configured", "_forward_compiled", "_cuda_graph_forward")
HELPER_PREFIX = "_ka_"
CONV_NAMES = (
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose2d",
)
MATMUL_NAMES = (
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "einsum",
    "linear",
    "Linear",
    "scaled_dot_product_attention",
    "MultiheadAttention",
    *CONV_NAMES,
)

HELPERS = {
    "half_precision": '''
def _ka_match_dtype(output, inputs):
    """Cast floating outputs back to the dtype of the first floating input (autocast may return lower precision)."""
    dtype = next((t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    if dtype is None:
        return output
    if isinstance(output, torch.Tensor):
        return output.to(dtype) if output.is_floating_point() else output
    if isinstance(output, tuple | list):
        return type(output)(_ka_match_dtype(item, inputs) for item in output)
    return output
''',
    "cuda_graphs": """
def _ka_all_cuda(inputs):
    return bool(inputs) and all(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)


def _ka_clone(output):
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, tuple | list):
        return type(output)(_ka_clone(item) for item in output)
    return output
""",
}

COMPILED = """
def _forward_compiled(self, *inputs):
    compiled = self.__dict__.get("_compiled_forward")
    if compiled is None:
        compiled = torch.compile(self._forward_impl)
        self.__dict__["_compiled_forward"] = compiled
    return compiled(*inputs)
"""

CUDA_GRAPH = '''
def _cuda_graph_forward(self, *inputs):
    """Capture {inner} once per input signature into a CUDA graph (static input buffers), then replay it."""
    graphs = self.__dict__.setdefault("_cuda_graphs", {{}})
    key = tuple((t.shape, t.dtype, t.device, t.stride()) for t in inputs)
    if key not in graphs:
        static_inputs = [t.clone() for t in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                self.{inner}(*static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_output = self.{inner}(*static_inputs)
        graphs[key] = (graph, static_inputs, static_output)
    graph, static_inputs, static_output = graphs[key]
    for static, given in zip(static_inputs, inputs):
        static.copy_(given)
    graph.replay()
    return _ka_clone(static_output)
'''


def _configured(applied: set[str], inner: str) -> str:
    lines = ["def _forward_configured(self, *inputs):"]
    if "channels_last" in applied:
        lines.append(
            "    inputs = tuple(t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) "
            "and t.dim() == 4 else t for t in inputs)"
        )
    flags = "tf32" in applied or "cudnn_benchmark" in applied
    if flags:
        lines += [
            "    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,",
            "             torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())",
        ]
    if "tf32" in applied:
        lines += [
            "    torch.backends.cuda.matmul.allow_tf32 = True",
            "    torch.backends.cudnn.allow_tf32 = True",
            "    torch.set_float32_matmul_precision('high')",
        ]
    if "cudnn_benchmark" in applied:
        lines.append("    torch.backends.cudnn.benchmark = True")
    call = f"self.{inner}(*inputs)"
    if "half_precision" in applied:
        body = [
            "device = next((t.device.type for t in inputs if isinstance(t, torch.Tensor)), 'cpu')",
            "dtype = torch.float16 if device == 'cuda' else torch.bfloat16",
            "with torch.autocast(device_type=device, dtype=dtype):",
            f"    output = {call}",
            "return _ka_match_dtype(output, inputs)",
        ]
    else:
        body = [f"return {call}"]
    if flags:
        lines.append("    try:")
        lines += ["        " + line for line in body]
        lines += [
            "    finally:",
            "        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,",
            "         torch.backends.cudnn.benchmark, precision) = saved",
            "        torch.set_float32_matmul_precision(precision)",
        ]
    else:
        lines += ["    " + line for line in body]
    return "\n".join(lines) + "\n"


def _forward(impl: ast.FunctionDef, applied: set[str], inner: str) -> ast.FunctionDef:
    args = ", ".join(param_names(impl))
    star = "*" if impl.args.vararg and not impl.args.args[1:] else ""
    lines = [f"    inputs = ({star}{args},)" if args else "    inputs = ()"]
    if "cuda_graphs" in applied:
        lines += ["    if _ka_all_cuda(inputs):", "        return self._cuda_graph_forward(*inputs)"]
    lines.append(f"    return self.{inner}(*inputs)")
    forward = parse_stmts("def forward(self):\n" + "\n".join(lines))[0]
    assert isinstance(forward, ast.FunctionDef)
    forward.args = impl.args
    return forward


def rebuild_layer(tree: ast.Module, ctx: Context) -> None:
    """Replace whatever layer exists by the one the applied techniques call for."""
    cls = ctx.cls
    impl = method(cls, IMPL_METHOD)
    if impl is None:
        impl = method(cls, "forward")
        assert impl is not None
        impl.name = IMPL_METHOD
    for name in LAYER_METHODS:
        remove_method(cls, name)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name.startswith(HELPER_PREFIX))]
    applied = set(ctx.applied) & set(LAYER_ORDER)
    inner = IMPL_METHOD
    methods: list[str] = []
    if "torch_compile" in applied:
        methods.append(COMPILED)
        inner = "_forward_compiled"
    if applied & CONFIG_TECHNIQUES:
        methods.append(_configured(applied, inner))
        inner = "_forward_configured"
    if "cuda_graphs" in applied:
        methods.append(CUDA_GRAPH.format(inner=inner))
    position = cls.body.index(impl)
    cls.body[position:position] = [_forward(impl, applied, inner)]
    cls.body[position + 2 : position + 2] = [parse_stmts(text)[0] for text in methods]
    helpers = [stmt for name, text in HELPERS.items() if name in applied for stmt in parse_stmts(text)]
    index = tree.body.index(cls)
    tree.body[index:index] = helpers


def _uses(tree: ast.Module, ctx: Context, names: tuple[str, ...]) -> bool:
    for node in ast.walk(ctx.cls):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and "matmul" in names:
            return True
        if isinstance(node, ast.Call):
            name = canonical(node.func, ctx.aliases) or ""
            if name.rsplit(".", 1)[-1] in names:
                return True
    return False


class LayerTechnique:
    """A technique realised by the generated execution layer."""

    name = ""
    summary = ""
    example = ""
    triggers: tuple[str, ...] = ()

    def applies(self, tree: ast.Module, ctx: Context) -> bool:
        if self.name in ctx.applied:
            return ctx.skip("already applied in an earlier turn")
        return self.relevant(tree, ctx)

    def relevant(self, tree: ast.Module, ctx: Context) -> bool:
        return True

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        rebuild_layer(tree, ctx)
        return tree


class TorchCompile(LayerTechnique):
    example = "Compile the model with torch.compile."
    name = "torch_compile"
    summary = "forward runs through torch.compile (inductor, default mode); everywhere, CPU included"
    triggers: tuple[str, ...] = (
        r"torch\.?[ _]?compile",
        r"\binductor\b",
        r"\bjit[- ]compil",
        r"\bcompile (the )?(model|forward|module|graph)",
        r"graph compil",
        r"\bdynamo\b",
    )


class CudaGraphs(LayerTechnique):
    example = "Capture forward in a CUDA graph to cut launch overhead."
    name = "cuda_graphs"
    summary = "CUDA inputs: forward captured once per input signature into a CUDA graph and replayed; CPU: eager"
    triggers: tuple[str, ...] = (
        r"cuda[ _-]?graphs?",
        r"graph (capture|replay)",
        r"captur\w* .*graph",
        r"launch overhead",
    )


class HalfPrecision(LayerTechnique):
    example = "Run in half precision with autocast (fp16/bf16)."
    name = "half_precision"
    summary = "autocast (fp16 on CUDA, bf16 on CPU) around forward, outputs cast back; may fail correctness"
    triggers: tuple[str, ...] = (
        r"half[- ]precision",
        r"\bfp16\b",
        r"float16",
        r"\bbf16\b",
        r"bfloat16",
        r"mixed[- ]precision",
        r"autocast",
        r"\bamp\b",
        r"(lower|reduced) precision",
        r"\bhalf\b",
    )

    def relevant(self, tree: ast.Module, ctx: Context) -> bool:
        return _uses(tree, ctx, MATMUL_NAMES) or ctx.skip(
            "autocast lowers matmul/convolution precision; there is none here"
        )


class Tf32(LayerTechnique):
    example = "Enable TF32 tensor cores for the matmuls."
    name = "tf32"
    summary = "TF32 matmul/cuDNN and float32 matmul precision 'high' for the duration of forward"
    triggers: tuple[str, ...] = (
        r"\btf32\b",
        r"tensor[- ]?float",
        r"float32_matmul_precision",
        r"allow_tf32",
        r"tensor cores?",
    )

    def relevant(self, tree: ast.Module, ctx: Context) -> bool:
        return _uses(tree, ctx, MATMUL_NAMES) or ctx.skip(
            "TF32 only changes matmuls and convolutions; there are none here"
        )


class CudnnBenchmark(LayerTechnique):
    example = "Turn on cudnn.benchmark so cuDNN picks the fastest convolution."
    name = "cudnn_benchmark"
    summary = "torch.backends.cudnn.benchmark = True for the duration of forward (convolution algorithm search)"
    triggers: tuple[str, ...] = (
        r"cudnn[._ ]?benchmark",
        r"cudnn auto[- ]?tun",
        r"benchmark mode",
        r"auto[- ]?tun\w* (the )?conv",
    )

    def relevant(self, tree: ast.Module, ctx: Context) -> bool:
        return _uses(tree, ctx, CONV_NAMES) or ctx.skip("cudnn.benchmark only tunes convolutions; there are none here")


class ChannelsLast(LayerTechnique):
    example = "Use the channels_last memory format for the convolution."
    name = "channels_last"
    summary = "convolution models: parameters and 4-D inputs in torch.channels_last memory format"
    triggers: tuple[str, ...] = (r"channels[_ -]?last", r"\bnhwc\b", r"memory[_ ]format")

    def relevant(self, tree: ast.Module, ctx: Context) -> bool:
        return _uses(tree, ctx, ("Conv2d", "conv2d", "ConvTranspose2d", "conv_transpose2d")) or ctx.skip(
            "channels-last helps 2-D convolutions; there are none here"
        )

    def apply(self, tree: ast.Module, ctx: Context) -> ast.Module:
        init = method(ctx.cls, "__init__")
        if init is not None:
            init.body.append(parse_stmts("self.to(memory_format=torch.channels_last)")[0])
        return super().apply(tree, ctx)
