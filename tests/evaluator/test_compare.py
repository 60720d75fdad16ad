"""Trusted output comparison (service side) on data as workers write it."""

from __future__ import annotations

import io
import itertools
import os
import time
import tracemalloc
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from services.evaluator import compare as compare_module
from services.evaluator.compare import (
    MAX_DEPTH,
    MAX_LEAVES,
    Comparison,
    MalformedDataError,
    compare_outputs,
    default_tolerance,
    flatten,
    output_size_limit,
)
from services.evaluator.verdict import truncate


def write_trial(out_dir: Path, trial: int, outputs: object, inputs_after: list[object]) -> None:
    out_dir.mkdir(exist_ok=True)
    torch.save({"outputs": outputs, "inputs_after": inputs_after}, out_dir / f"{trial}.pt")


def compare(
    tmp_path: Path,
    expected: object,
    produced: object,
    inputs: list[object] | None = None,
    after: list[object] | None = None,
    **tolerances: float,
):
    inputs = inputs if inputs is not None else [torch.ones(3)]
    write_trial(tmp_path / "out", 0, produced, after if after is not None else inputs)
    return compare_outputs(
        tmp_path / "out", [expected], [inputs], tolerances.get("atol"), tolerances.get("rtol"), 1 << 20
    )


def test_close_outputs_are_correct_with_errors_reported(tmp_path: Path) -> None:
    expected = torch.tensor([1.0, 2.0, 4.0])
    result = compare(tmp_path, expected, expected + 1e-6)
    assert result.correct and result.max_abs_error == pytest.approx(1e-6, rel=0.1)
    assert result.max_rel_error is not None and result.max_rel_error < 1e-6


@pytest.mark.parametrize(
    ("produced", "reason"),
    [
        (torch.tensor([1.0, 2.0, 4.1]), "differs"),
        (torch.tensor([1.0, 2.0]), "shape"),
        (torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64), "dtype"),
        (torch.tensor([1.0, float("nan"), 4.0]), "NaN"),
        (torch.tensor([1.0, float("inf"), 4.0]), "NaN/Inf"),
        ([torch.tensor([1.0, 2.0, 4.0])] * 2, "outputs"),
        ("not a tensor", "expected a tensor"),
    ],
)
def test_wrong_outputs_are_incorrect(tmp_path: Path, produced: object, reason: str) -> None:
    result = compare(tmp_path, torch.tensor([1.0, 2.0, 4.0]), produced)
    assert not result.correct and reason in result.message


def test_tolerances_follow_dtype_and_request(tmp_path: Path) -> None:
    assert default_tolerance(torch.float32) == 1e-4 and default_tolerance(torch.bfloat16) == 1e-2
    half = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert compare(tmp_path, half, half + 0.005).correct
    assert not compare(tmp_path, torch.tensor([1.0]), torch.tensor([1.001])).correct
    assert compare(tmp_path, torch.tensor([1.0]), torch.tensor([1.001]), atol=1e-2).correct


def test_matching_nan_positions_are_equal(tmp_path: Path) -> None:
    expected = torch.tensor([float("nan"), 1.0])
    assert compare(tmp_path, expected, expected.clone()).correct


def test_input_mutation_is_detected(tmp_path: Path) -> None:
    inputs = [torch.ones(3), 5]
    assert not compare(tmp_path, torch.ones(1), torch.ones(1), inputs, [torch.ones(3), 5]).input_mutation
    assert compare(tmp_path, torch.ones(1), torch.ones(1), inputs, [torch.zeros(3), 5]).input_mutation


SENTINEL = object()


def compare_file(out_dir: Path, expected: object = SENTINEL, **options: object) -> Comparison:
    """compare_outputs of trial 0 in `out_dir` against `expected` (default: one tensor of ones, no inputs)."""
    want = torch.ones(1) if expected is SENTINEL else expected
    max_bytes = options.pop("max_bytes", 1 << 20)
    return compare_outputs(out_dir, [want], [[]], None, None, max_bytes, **options)  # type: ignore[arg-type]


def save_ones(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"outputs": torch.ones(1), "inputs_after": []}, path)
    return path


def test_plain_output_file_is_correct(tmp_path: Path) -> None:
    save_ones(tmp_path / "out" / "0.pt")
    assert compare_file(tmp_path / "out").correct


def test_symlinked_output_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "0.pt").symlink_to(save_ones(tmp_path / "real.pt"))
    result = compare_file(tmp_path / "out")
    assert not result.correct and "unreadable" in result.message


def test_symlinked_out_dir_is_refused(tmp_path: Path) -> None:
    save_ones(tmp_path / "elsewhere" / "0.pt")
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    result = compare_file(tmp_path / "out")
    assert not result.correct and "unreadable" in result.message


def test_symlink_between_trusted_root_and_out_dir_is_refused(tmp_path: Path) -> None:
    save_ones(tmp_path / "real_home" / "out" / "0.pt")
    (tmp_path / "home").symlink_to(tmp_path / "real_home")
    assert compare_file(tmp_path / "real_home" / "out", trusted_root=tmp_path).correct
    result = compare_file(tmp_path / "home" / "out", trusted_root=tmp_path)
    assert not result.correct and "unreadable" in result.message


def test_hard_linked_output_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    os.link(save_ones(tmp_path / "other_job.pt"), tmp_path / "out" / "0.pt")
    result = compare_file(tmp_path / "out")
    assert not result.correct and "hard links" in result.message


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_output_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    path = save_ones(tmp_path / "out" / "0.pt")
    os.chown(path, 54321, 54321)
    assert compare_file(tmp_path / "out", owner_uid=54321).correct
    result = compare_file(tmp_path / "out", owner_uid=os.geteuid())
    assert not result.correct and "owned by uid 54321" in result.message


def test_oversized_output_is_refused_before_it_is_read(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / "0.pt", "wb") as handle:
        handle.truncate(2 << 30)  # sparse: 2 GiB by size, no blocks on disk
    tracemalloc.start()
    try:
        started = time.monotonic()
        result = compare_file(tmp_path / "out", max_bytes=4 << 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    limit = output_size_limit(torch.ones(1), [])
    assert not result.correct and result.message == f"trial 0: output file of {2 << 30} bytes, expected at most {limit}"
    assert peak < 16 << 20 and time.monotonic() - started < 5


def test_output_size_limit_follows_the_reference(tmp_path: Path) -> None:
    expected, inputs = torch.ones(1 << 20), [torch.ones(1 << 18)]
    limit = output_size_limit(expected, inputs)
    assert (1 << 20) * 4 * 2 < limit < 12 << 20
    write_trial(tmp_path / "out", 0, torch.ones(1 << 20), [torch.ones(1 << 18)])
    assert compare_outputs(tmp_path / "out", [expected], [inputs], None, None, 1 << 30).correct
    write_trial(tmp_path / "out", 0, [torch.ones(1 << 20), torch.zeros(3 << 20)], [torch.ones(1 << 18)])
    result = compare_outputs(tmp_path / "out", [expected], [inputs], None, None, 1 << 30)
    assert not result.correct and f"expected at most {limit}" in result.message


def test_millions_of_leaves_from_a_small_file_are_refused_quickly(tmp_path: Path) -> None:
    leaf = torch.ones(1)
    many = (((leaf,) * 128,) * 256,) * 256  # 2**23 leaves; pickle stores each tuple and the tensor once
    write_trial(tmp_path / "out", 0, many, [])
    assert (tmp_path / "out" / "0.pt").stat().st_size < 64 << 10
    started = time.monotonic()
    result = compare_file(tmp_path / "out")
    assert not result.correct and "reaches more than" in result.message, result.message
    assert time.monotonic() - started < 2


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    deep: object = torch.ones(1)
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    write_trial(tmp_path / "out", 0, deep, [])
    result = compare_file(tmp_path / "out")
    assert not result.correct and "nested deeper" in result.message


def test_pathologically_deep_pickle_is_incorrect_not_a_crash(tmp_path: Path) -> None:
    depth = 200_000  # far past the recursion limit, built by pickle opcodes rather than by recursion
    nested = b"]" * depth + b"a" * (depth - 1)
    rewrite_pickle(tmp_path / "out" / "0.pt", b"\x80\x02}(" + text("outputs") + nested + text("inputs_after") + b"]u.")
    result = compare_file(tmp_path / "out")
    assert not result.correct and not result.timed_out and "nested deeper" in result.message
    assert flatten(torch.load(tmp_path / "out" / "0.pt", weights_only=True)["inputs_after"]) == []


def test_past_deadline_is_a_timeout(tmp_path: Path) -> None:
    save_ones(tmp_path / "out" / "0.pt")
    result = compare_file(tmp_path / "out", deadline=time.monotonic() - 1)
    assert not result.correct and result.timed_out and result.message == "comparison exceeded the time limit"
    assert compare_file(tmp_path / "out", deadline=time.monotonic() + 60).correct


def test_deadline_is_checked_between_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_trial(tmp_path / "out", 0, torch.ones(64), [])
    monkeypatch.setattr(compare_module, "CHUNK_ELEMENTS", 4)  # 16 chunks
    calls = itertools.count()
    monkeypatch.setattr(compare_module, "time", SimpleNamespace(monotonic=lambda: float(next(calls))))
    assert compare_file(tmp_path / "out", torch.ones(64), deadline=1000.0).correct
    calls = itertools.count()
    result = compare_file(tmp_path / "out", torch.ones(64), deadline=8.0)
    assert result.timed_out and not result.correct and next(calls) < 12


def test_chunked_comparison_keeps_whole_tensor_semantics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare_module, "CHUNK_ELEMENTS", 3)
    expected = torch.arange(10, dtype=torch.float32)
    produced = expected.clone()
    produced[1] += 1e-6
    produced[8] += 2e-5
    result = compare(tmp_path, expected, produced)
    assert result.correct and result.max_abs_error == pytest.approx(2e-5, rel=0.1)
    produced[9] = float("nan")
    assert "NaN" in compare(tmp_path, expected, produced).message
    produced[9], produced[2] = 9.0, 3.0
    assert "differs" in compare(tmp_path, expected, produced).message


def test_wrong_imaginary_part_is_incorrect(tmp_path: Path) -> None:
    expected = torch.tensor([1 + 1j, 2 - 3j], dtype=torch.complex64)
    assert compare(tmp_path, expected, expected.clone()).correct
    result = compare(tmp_path, expected, torch.tensor([1 + 1j, 2 + 3j], dtype=torch.complex64))
    assert not result.correct and "differs" in result.message
    assert result.max_abs_error == pytest.approx(6.0)
    assert compare(tmp_path, expected, expected + 1e-6j).correct  # complex64 gets float32's tolerance


def test_conjugate_view_is_compared_by_value(tmp_path: Path) -> None:
    expected = torch.tensor([1 + 1j, 2 - 3j])
    assert compare(tmp_path, expected, expected.conj().conj()).correct
    assert not compare(tmp_path, expected, expected.conj()).correct


@pytest.mark.parametrize(
    ("produced", "reason"),
    [
        (torch.tensor([1.0, 2.0, 4.0]).to_sparse(), "global 'torch._utils _rebuild_sparse_tensor'"),
        (torch.nn.Parameter(torch.tensor([1.0, 2.0, 4.0])), "global 'torch._utils _rebuild_parameter'"),
        (torch.tensor([1.0]).expand(3), "overlapping"),
        ({"a": torch.tensor([1.0, 2.0, 4.0])}, "dict"),
        ([torch.tensor([1.0, 2.0, 4.0]), "text"], "str"),
        (2**70, "64 bits"),
    ],
)
def test_data_our_runner_never_writes_is_incorrect(tmp_path: Path, produced: object, reason: str) -> None:
    result = compare(tmp_path, torch.tensor([1.0, 2.0, 4.0]), produced)
    assert not result.correct and reason in result.message, result.message


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_matrix_output_is_not_densified(tmp_path: Path) -> None:
    expected = torch.eye(3)
    for sparse in (expected.to_sparse(), expected.to_sparse_csr(), expected.to_sparse_csc()):
        result = compare(tmp_path, expected, sparse)
        assert not result.correct and "_rebuild_sparse" in result.message, result.message


def test_none_outputs_match_none(tmp_path: Path) -> None:
    assert compare(tmp_path, [torch.ones(2), None], [torch.ones(2), None]).correct
    assert "expected None" in compare(tmp_path, [torch.ones(2), None], [torch.ones(2), torch.ones(1)]).message


@pytest.mark.parametrize("kind", ["legacy", "deflated", "garbage"])
def test_files_torch_save_never_writes_are_unreadable(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "out" / "0.pt"
    path.parent.mkdir()
    payload = {"outputs": torch.ones(1), "inputs_after": []}
    if kind == "legacy":
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    elif kind == "deflated":
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source, zipfile.ZipFile(path, "w") as target:
            for name in source.namelist():
                target.writestr(name, source.read(name), compress_type=zipfile.ZIP_DEFLATED)
        assert torch.load(path, weights_only=True)["outputs"] == 1  # torch itself would read it
    else:
        path.write_bytes(b"PK\x03\x04" + os.urandom(100))
    result = compare_file(tmp_path / "out")
    assert not result.correct and "unreadable" in result.message


def test_mutated_input_with_nans_in_place_is_not_mutation(tmp_path: Path) -> None:
    inputs = [torch.tensor([float("nan"), 1.0])]
    assert not compare(tmp_path, torch.ones(1), torch.ones(1), inputs, [inputs[0].clone()]).input_mutation
    assert compare(tmp_path, torch.ones(1), torch.ones(1), inputs, [torch.tensor([float("nan"), 2.0])]).input_mutation
    assert compare(tmp_path, torch.ones(1), torch.ones(1), inputs, []).input_mutation


def test_malformed_file_contents_are_incorrect(tmp_path: Path) -> None:
    for content in ([1, 2], {"outputs": torch.ones(1)}, {"outputs": torch.ones(1), "inputs_after": 5}):
        (tmp_path / "out").mkdir(exist_ok=True)
        torch.save(content, tmp_path / "out" / "0.pt")
        result = compare_file(tmp_path / "out")
        assert not result.correct and "malformed" in result.message, content


def test_flatten_is_bounded_and_ordered() -> None:
    leaves = flatten([torch.zeros(1), (1, [2.5, None]), True])
    assert [leaf if leaf is None else leaf.item() for leaf in leaves] == [0.0, 1, 2.5, None, True]
    with pytest.raises(MalformedDataError, match="more than 3"):
        flatten([1, 2, 3, 4], max_leaves=3)
    with pytest.raises(MalformedDataError, match="deeper"):
        flatten([[[1]]], max_depth=2)
    assert len(flatten([[[1]]], max_depth=3)) == 1
    shared: list = []
    for _ in range(MAX_DEPTH - 1):
        shared = [shared] * 1000  # no leaf, 1000^15 lists to walk
    with pytest.raises(MalformedDataError, match="lists"):
        flatten(shared)


def text(value: str) -> bytes:
    """Pickle BINUNICODE opcode for `value`."""
    encoded = value.encode()
    return b"X" + len(encoded).to_bytes(4, "little") + encoded


def rewrite_pickle(path: Path, pickle_bytes: bytes) -> None:
    """A torch.save archive whose data.pkl is `pickle_bytes` (written by hand: deeper than the pickler recurses)."""
    buffer = io.BytesIO()
    torch.save({"outputs": [], "inputs_after": []}, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source, zipfile.ZipFile(path, "w") as target:
        for name in source.namelist():
            target.writestr(name, pickle_bytes if name.endswith("/data.pkl") else source.read(name))


def test_truncate_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    short = truncate(text, 1000)
    assert len(short) <= 1000 and short.startswith("HEAD") and short.endswith("TAIL") and "cut" in short


def timer_check(home: Path, expected: object, saved: object, **command: object) -> dict:
    """runner.check_saved_output (the reference timer's `check`) of `saved`, written as a candidate's save and
    copied to the timer's inputs as check 1, against `expected`."""
    from services.evaluator import runner
    from services.evaluator.backends import get_backend

    (home / "inputs").mkdir(exist_ok=True)
    torch.save({"outputs": saved, "inputs_after": []}, home / "inputs" / "check_1.pt")
    context = SimpleNamespace(home=home, backend=get_backend("cpu"))
    return runner.check_saved_output(context, expected, {"check": 1, "seconds": 60, **command})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "saved",
    [torch.full((1,), 2.0), torch.ones(1).to_sparse(), torch.ones(1, device="meta"), None],
    ids=["other_bytes", "sparse", "meta", "none"],
)
def test_a_wrong_or_strange_saved_output_is_never_an_error(tmp_path: Path, saved: object) -> None:
    """The timer's check of a saved output of other bytes, or of a kind torch.load takes but no call returns (sparse,
    meta), reports a reason and never raises; the right output none (a saved output has no commitment on a CPU,
    where the judge copies a timed call's output from memory itself)."""
    found = timer_check(tmp_path, torch.ones(1), saved)
    assert found["commitment"] is None and found["reason"]
    (tmp_path / "inputs" / "check_1.pt").unlink()
    found = timer_check(tmp_path, torch.ones(1), torch.ones(1))
    assert found == {"reason": "", "commitment": None, "max_abs": 0.0, "max_rel": 0.0, "timed_out": False}


def test_a_saved_output_with_overlapping_memory_is_refused(tmp_path: Path) -> None:
    """A saved tensor of 2^36 elements over 4 bytes of storage (stride 0, which torch.load rebuilds) is refused
    before anything could materialise its 256 GiB."""
    huge = torch.ones(1).as_strided((1 << 36,), (0,))
    found = timer_check(tmp_path, torch.ones(1), huge)
    assert "overlapping" in found["reason"], found


def test_leaves_that_share_one_storage_are_refused_unless_shaped_as_expected(tmp_path: Path) -> None:
    """4096 leaves that each view the same 4 MiB storage: one storage in the file, 16 GiB to read leaf by leaf.
    Not the reference's outputs, so the check says why at once."""
    base = torch.zeros(1 << 20)
    found = timer_check(tmp_path, [torch.ones(4)], [base] * 4096)
    assert "returned 4096 outputs, expected 1" in found["reason"], found


def test_a_reference_with_more_leaves_than_a_candidate_may_have_is_checked_not_raised(tmp_path: Path) -> None:
    """The reference's output is trusted and may exceed MAX_LEAVES; the shape test held it to the candidate's limit,
    and the timer raised (the candidate's save chose the timer's failure)."""
    found = timer_check(tmp_path, [torch.ones(1)] * (MAX_LEAVES + 1), [torch.ones(1)])
    assert "returned 1 outputs" in found["reason"], found


def test_a_right_output_of_more_leaves_than_a_candidate_may_have_passes_the_timer_check(tmp_path: Path) -> None:
    """Where the reference returns more than MAX_LEAVES outputs, a candidate may return as many (compare_trial's
    rule); the timer's check held the save to MAX_LEAVES, called the right answer unreadable, and the candidate
    was stale_output."""
    outputs = [torch.full((1,), float(i)) for i in range(MAX_LEAVES + 1)]
    found = timer_check(tmp_path, outputs, outputs)
    assert found["reason"] == "", found


def copied_check(home: Path, expected: object, output: list[torch.Tensor], **copied: object) -> dict:
    """runner.check_saved_output of `output` as the judge copies a timed call's from a candidate's memory
    (held_memory.copy_out: here this process's own) into the timer's inputs as check 1, read by the tensors' own
    sizes and strides unless `copied` says otherwise, against `expected`."""
    from services.evaluator import held_memory, runner
    from services.evaluator.backends import get_backend

    (home / "inputs").mkdir(exist_ok=True)
    regions = [[t.data_ptr(), t.numel() * t.element_size()] for t in output]
    with (home / "inputs" / "check_1.raw").open("wb") as destination:
        held_memory.copy_out(os.getpid(), regions, 1 << 30, True, destination.write)
    described = {"sizes": [size for _, size in regions], "strides": [list(t.stride()) for t in output], **copied}
    context = SimpleNamespace(home=home, backend=get_backend("cpu"))
    command = {"check": 1, "seconds": 60, "copied": described}
    return runner.check_saved_output(context, expected, command)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: [torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)],
        lambda: [torch.randn(6, 4).t()],
        lambda: [torch.randn(8, 8)[2:4]],
        lambda: [torch.randn(3, 5, dtype=torch.float16)[:, :3].contiguous(), torch.randn(4, 4).double()],
        lambda: [torch.randint(0, 9, (7,), dtype=torch.int8), torch.randn(2, 2)],
        lambda: [torch.tensor(3.5), torch.zeros(0, 4)],
    ],
    ids=["channels_last", "transposed", "offset_slice", "half_then_double", "odd_bytes_then_float", "scalar_and_empty"],
)
def test_a_copied_output_is_read_as_it_lay_and_checked(tmp_path: Path, make) -> None:  # noqa: ANN001
    """The judge's copy of a dense output in any order of its dimensions, one tensor after another (a float after
    7 bytes lies where no float can be viewed), is the output the timed call returned; a changed element is not."""
    output = make()
    expected = [t.contiguous().clone() for t in output]
    assert timer_check_copied_reason(tmp_path, expected, output) == ""
    changed = [t.clone() for t in output]
    if changed[0].numel():
        changed[0][(0,) * changed[0].dim()] += 1
        assert "differs" in timer_check_copied_reason(tmp_path, expected, changed)


def timer_check_copied_reason(home: Path, expected: object, output: list[torch.Tensor]) -> str:
    found = copied_check(home, expected, output)
    (home / "inputs" / "check_1.raw").unlink()
    assert found["commitment"] is None
    return found["reason"]


@pytest.mark.parametrize(
    ("copied", "needle"),
    [
        ({"sizes": [64]}, "1 tensors where"),
        ({"sizes": [60, 4]}, "has 60 bytes, expected 64"),
        ({"strides": [[0, 1], [1]]}, "do not fill its memory exactly once"),
        ({"strides": [[4], [1]]}, "for a shape of 2 dimensions"),
        ({"strides": [[4, "1"], [1]]}, "has strides"),
        ({"strides": [[-4, 1], [1]]}, "unreadable output"),
        ({"strides": None}, "cannot be read as"),
    ],
    ids=["fewer_tensors", "other_size", "overlapping", "fewer_dims", "not_ints", "negative", "none"],
)
def test_a_copy_that_cannot_be_the_output_is_a_reason_never_an_error(tmp_path: Path, copied: dict, needle: str) -> None:
    """The reply's sizes and strides only say how to read the bytes the judge copied: any that cannot describe the
    reference's output are the candidate's wrong output, reported as a reason, never the timer's failure."""
    output = [torch.ones(4, 4), torch.ones(1)]
    found = copied_check(tmp_path, [torch.ones(4, 4), torch.ones(1)], output, **copied)
    assert "unreadable output" in found["reason"] and needle in found["reason"], found


def test_the_timer_check_reports_the_error_of_a_wrong_output(tmp_path: Path) -> None:
    found = timer_check(tmp_path, torch.zeros(4), torch.tensor([0.0, 0.0, 0.5, 0.0]))
    assert "differs beyond" in found["reason"] and found["max_abs"] == pytest.approx(0.5)
    (tmp_path / "inputs" / "check_1.pt").unlink()
    found = timer_check(tmp_path, torch.zeros(4), torch.tensor([0.0, 0.0, 0.5, 0.0]), atol=1.0)
    assert found["reason"] == ""


def test_verdict_and_errors_agree_with_torch_isclose_on_special_values(tmp_path: Path) -> None:
    """The comparison measures errors without boolean indexing; it must decide as torch.isclose(equal_nan=True)
    over the whole output and report the errors over the positions where both are finite."""
    generator = torch.Generator().manual_seed(0)
    specials = torch.tensor([0.0, float("nan"), float("inf"), -float("inf"), 1e-5, -3.0])
    for case in range(300):
        expected = torch.randn(8, generator=generator)
        noise = [0.0, 1e-6, 1e-4, 1e-3, 1.0][case % 5]
        produced = expected + noise * torch.randn(8, generator=generator)
        for tensor in (expected, produced):
            where = torch.randint(0, 8, (case % 3,), generator=generator)
            tensor[where] = specials[torch.randint(0, len(specials), (len(where),), generator=generator)]
        result = compare(tmp_path, expected, produced)
        finite = expected.isfinite() & produced.isfinite()
        if (expected.isfinite() & ~produced.isfinite()).any():
            assert not result.correct and "NaN/Inf" in result.message, (expected, produced)
            continue
        close = bool(torch.isclose(produced.double(), expected.double(), rtol=1e-4, atol=1e-4, equal_nan=True).all())
        assert result.correct == close, (expected, produced, result.message)
        if finite.any():
            diff = (produced.double() - expected.double()).abs()[finite]
            assert result.max_abs_error == pytest.approx(float(diff.max()), abs=1e-12), (expected, produced)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_timer_check_on_a_gpu_commits_to_the_block_sketch(tmp_path: Path) -> None:
    """On a GPU the timer hashes the saved output on its device and compares it there with its own: the
    commitment is the sketch the candidate's block reply made of the same output, and a wrong element fails."""
    from services.evaluator import output_digest, runner
    from services.evaluator.backends import get_backend

    produced = torch.randn(3, 1 << 20, device="cuda")
    expected = produced.clone()
    sketch = output_digest.block_sketches([produced])[0]
    (tmp_path / "inputs").mkdir()
    context = SimpleNamespace(home=tmp_path, backend=get_backend("cuda"))
    for check, saved in enumerate([produced.cpu(), produced.cpu().index_fill_(1, torch.tensor([7]), 9.0)], 1):
        torch.save({"outputs": saved, "inputs_after": []}, tmp_path / "inputs" / f"check_{check}.pt")
        found = runner.check_saved_output(context, expected, {"check": check, "seconds": 60})  # type: ignore[arg-type]
        if check == 1:
            assert found["commitment"] == sketch and found["reason"] == "", found
        else:
            assert found["commitment"] != sketch and "differs" in found["reason"], found
