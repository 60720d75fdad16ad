"""The builtin rule engine on source text alone (fast): recognition, rewrites, idempotence, composition."""

from __future__ import annotations

import ast

import pytest

from problems import builtin_problems, get_problem
from services.implementer.rules import ORDER, TECHNIQUES, RewriteError, recognise, rewrite
from services.implementer.rules.astutil import body_function, model_class

PROBLEMS = {p.id.removeprefix("builtin/"): p.source for p in builtin_problems("cpu")}
EXAMPLE = {t.name: t.example for t in TECHNIQUES}


def forward_text(source: str) -> str:
    cls = model_class(ast.parse(source))
    assert cls is not None
    return ast.unparse(body_function(cls))


def test_vocabulary_is_documented_and_each_example_triggers_its_technique() -> None:
    assert len(TECHNIQUES) >= 8 and len(set(ORDER)) == len(ORDER)
    for technique in TECHNIQUES:
        assert technique.summary and technique.triggers
        assert technique.name in [t.name for t in recognise(technique.example)]
        assert technique.name in [t.name for t in recognise(technique.example.upper())]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Use torch.compile with inductor", {"torch_compile"}),
        ("Capture the forward in CUDA graphs and fuse the elementwise ops", {"cuda_graphs", "fuse_elementwise"}),
        ("Switch to bf16 autocast and enable TF32", {"half_precision", "tf32"}),
        ("Replace the manual softmax with F.softmax", {"fused_library_calls"}),
        ("Convert to NHWC (channels_last) and set cudnn.benchmark", {"channels_last", "cudnn_benchmark"}),
        ("Precompute the causal mask once in __init__", {"hoist_constants"}),
        ("Use in-place ReLU", {"inplace_ops"}),
        ("The exp(x) is computed twice: remove the redundant work", {"remove_redundant"}),
        ("Make it go faster somehow", set()),
    ],
)
def test_recognition(text: str, expected: set[str]) -> None:
    assert {t.name for t in recognise(text)} == expected


def test_first_turn_renames_model_and_never_reaches_for_the_reference() -> None:
    result = rewrite(PROBLEMS["softmax_primitives"], EXAMPLE["fused_library_calls"], "cuda")
    tree = ast.parse(result.source)
    assert model_class(tree) is not None
    assert not any(isinstance(n, ast.Name) and n.id == "Model" for n in ast.walk(tree))
    assert not any(isinstance(n, ast.ClassDef) and n.name == "Model" for n in ast.walk(tree))
    assert result.source.startswith("# kernel-agent techniques: fused_library_calls\n")
    assert "F.softmax(x, dim=-1)" in forward_text(result.source)


def test_unrecognised_suggestion_keeps_the_kernel() -> None:
    source = PROBLEMS["elementwise_chain"]
    result = rewrite(source, "Think harder about performance.", "cuda")
    assert result.recognised == [] and result.applied == []
    assert forward_text(result.source) == forward_text(source.replace("class Model(", "class ModelNew("))


def test_recognised_but_not_applicable_says_why() -> None:
    result = rewrite(PROBLEMS["softmax_primitives"], EXAMPLE["channels_last"], "cuda")
    assert result.applied == [] and result.recognised == ["channels_last"]
    assert "2-D convolutions" in result.notes[0]


def test_bad_current_source_is_a_rewrite_error() -> None:
    with pytest.raises(RewriteError, match="does not parse"):
        rewrite("def f(:", "use torch.compile", "cuda")
    with pytest.raises(RewriteError, match="neither ModelNew nor Model"):
        rewrite("import torch\n", "use torch.compile", "cuda")


def test_rewriting_never_executes_the_module(tmp_path) -> None:  # noqa: ANN001
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w')\n" + PROBLEMS["elementwise_chain"]
    for technique in TECHNIQUES:
        rewrite(source, technique.example, "cuda")
    assert not marker.exists()


@pytest.mark.parametrize("technique", ORDER)
def test_every_technique_is_idempotent_on_every_problem(technique: str) -> None:
    for name, source in PROBLEMS.items():
        once = rewrite(source, EXAMPLE[technique], "cuda")
        twice = rewrite(once.source, EXAMPLE[technique], "cuda")
        ast.parse(twice.source)
        assert model_class(ast.parse(twice.source)) is not None, name
        if technique in once.applied and technique not in ("fuse_elementwise", "remove_redundant"):
            assert twice.applied == [] and twice.source == once.source, name


def test_layer_techniques_compose_in_any_order() -> None:
    source = PROBLEMS["matmul_bias_relu"]
    names = ["torch_compile", "tf32", "cuda_graphs", "half_precision"]
    forward, backward = source, source
    for name in names:
        forward = rewrite(forward, EXAMPLE[name], "cuda").source
    for name in reversed(names):
        backward = rewrite(backward, EXAMPLE[name], "cuda").source
    assert forward == backward
    assert forward.startswith("# kernel-agent techniques: half_precision, tf32, torch_compile, cuda_graphs\n")
    assert "torch.compile(self._forward_impl)" in forward and "torch.cuda.CUDAGraph()" in forward
    assert "torch.autocast" in forward and "allow_tf32 = True" in forward


def test_body_techniques_compose_with_layer_techniques() -> None:
    first = rewrite(PROBLEMS["elementwise_chain"], EXAMPLE["torch_compile"], "cuda")
    second = rewrite(first.source, EXAMPLE["inplace_ops"], "cuda")
    assert second.applied == ["inplace_ops"]
    assert second.source.startswith("# kernel-agent techniques: inplace_ops, torch_compile\n")
    impl = [
        n for n in ast.walk(ast.parse(second.source)) if isinstance(n, ast.FunctionDef) and n.name == "_forward_impl"
    ]
    assert impl and ".relu_()" in ast.unparse(impl[0]) and "torch.compile" in second.source


def test_inplace_never_mutates_an_input() -> None:
    result = rewrite(PROBLEMS["elementwise_chain"], EXAMPLE["inplace_ops"], "cuda")
    body = body_function(model_class(ast.parse(result.source))).body  # type: ignore[arg-type]
    assert ast.unparse(body[0]) == "x = x * 2.0"  # the input itself: stays out of place
    assert [ast.unparse(s) for s in body[1:3]] == ["x = x.add_(1.0)", "x = x.relu_()"]


def test_several_techniques_in_one_suggestion_apply_in_fixed_order() -> None:
    text = "Use torch.compile, and before that replace the hand-written GELU with the library call."
    result = rewrite(PROBLEMS["gelu_tanh_manual"], text, "cuda")
    assert result.applied == ["fused_library_calls", "torch_compile"]
    assert "F.gelu(x, approximate='tanh')" in result.source


@pytest.mark.parametrize("target", ["cuda", "triton", "torch"])
def test_fuse_elementwise_per_target(target: str) -> None:
    result = rewrite(PROBLEMS["scale_shift_clamp"], EXAMPLE["fuse_elementwise"], target)
    assert result.applied == ["fuse_elementwise"]
    forward = forward_text(result.source)
    if target == "cuda":
        assert "load_inline" in result.source and "__global__ void fused_kernel" in result.source
        assert "at::parallel_for" in result.source and "x.is_cuda" in result.source
        assert forward.count("\n") == 1 and "_fused_" in forward  # the whole chain is one call
    elif target == "triton":
        assert "@triton.jit" in result.source and "return torch.abs(" in result.source  # eager fallback off CUDA
    else:
        assert "load_inline" not in result.source and forward.count("\n") == 1


def test_patterns_cover_the_hand_written_problems() -> None:
    expected = {
        "softmax_primitives": "F.softmax(x, dim=-1)",
        "log_softmax_primitives": "F.log_softmax(x, dim=-1)",
        "layernorm_manual": "F.layer_norm(x, self.weight.shape, self.weight, self.bias, eps=self.eps)",
        "rmsnorm_manual": "F.rms_norm(x, self.weight.shape, self.weight, eps=self.eps)",
        "gelu_tanh_manual": "F.gelu(x, approximate='tanh')",
        "matmul_bias_gelu": "F.gelu(",
        "swish_manual": "F.silu(x)",
        "mish_manual": "F.mish(x)",
        "mse_reduction": "F.mse_loss(predictions, targets)",
        "matmul_bias_relu": "F.linear(x, self.weight, self.bias)",
        "attention_small": "F.scaled_dot_product_attention(",
        "row_l2_norm": "torch.linalg.vector_norm(x, dim=1",
        "variance_two_pass": "torch.var(x, dim=1",
    }
    for name, call in expected.items():
        if name not in PROBLEMS:
            continue
        result = rewrite(PROBLEMS[name], EXAMPLE["fused_library_calls"], "cuda")
        assert call in forward_text(result.source), name


def test_hoisting_moves_constants_to_buffers_and_parameters_to_a_versioned_cache() -> None:
    mask = rewrite(PROBLEMS["redundant_mask"], EXAMPLE["hoist_constants"], "cuda").source
    assert "register_buffer('_hoisted_0'" in mask and "persistent=False" in mask
    assert "torch.tril" not in forward_text(mask)
    weight = rewrite(PROBLEMS["redundant_transpose"], EXAMPLE["hoist_constants"], "cuda").source
    assert "self.weight._version" in weight and "torch.is_grad_enabled()" in weight
    assert ".contiguous()" not in forward_text(weight).split("b =")[0]


def test_common_subexpressions_are_computed_once() -> None:
    result = rewrite(get_problem("builtin/redundant_duplicate").source, EXAMPLE["remove_redundant"], "cuda")
    forward = forward_text(result.source)
    assert forward.count("torch.exp(x)") == 1 and forward.count("torch.tanh(x)") == 1
