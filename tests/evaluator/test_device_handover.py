"""Checked outputs handed over in GPU memory (device_handover): what the service takes from a candidate's socket
(real unix sockets, real descriptors; on any machine), and on a GPU a real export in one process and its copy in
another, also across a pid namespace as in strict isolation."""

from __future__ import annotations

import array
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from services.evaluator import device_handover  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def pair():
    service, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    service.setblocking(False)
    yield service, worker
    service.close()
    worker.close()


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def _pipe_fds() -> list[int]:
    read, write = os.pipe()
    return [read, write]


def _refused_and_closed(service: socket.socket, match: str | None) -> None:
    """The service's receive refuses what was queued, and no descriptor it received is left open."""
    before = _open_fds()
    with pytest.raises(device_handover.HandoverError, match=match):
        device_handover.receive_for(service, "n")
    assert _open_fds() == before


def test_the_service_takes_the_save_s_message_and_drops_what_was_queued_before(pair) -> None:
    service, worker = pair
    worker.send(b"not json")
    worker.send(b"[1, 2]")
    for junk in (_pipe_fds(), _pipe_fds()):
        device_handover.send(worker, {"nonce": "a guess", "tensors": []}, junk)
        device_handover.close_all(junk)
    device_handover.send(worker, {"nonce": "the save's", "tensors": [{"shape": [2]}]}, [])
    before = _open_fds()
    header, fds = device_handover.receive_for(service, "the save's")
    assert header == {"nonce": "the save's", "tensors": [{"shape": [2]}]} and fds == []
    # The descriptors of the dropped messages were received and closed again: none left open in the service.
    assert _open_fds() == before


def test_descriptors_that_are_not_gpu_allocations_are_refused_and_closed(pair, tmp_path: Path) -> None:
    service, worker = pair
    regular = os.open(tmp_path / "file", os.O_CREAT | os.O_RDWR)
    null = os.open("/dev/null", os.O_RDONLY)
    pipe = _pipe_fds()
    for fd in (regular, null, *pipe):
        assert not device_handover.is_device_handle(fd)
    device_handover.send(worker, {"nonce": "n", "tensors": [{}, {}, {}]}, [regular, null, pipe[0]])
    device_handover.close_all([regular, null, *pipe])
    _refused_and_closed(service, "not GPU allocations")


def test_a_save_without_its_message_is_refused(pair) -> None:
    service, worker = pair
    device_handover.send(worker, {"nonce": "another"}, [])
    with pytest.raises(device_handover.HandoverError, match="no handover message"):
        device_handover.receive_for(service, "n")
    with pytest.raises(device_handover.HandoverError, match="no handover message"):
        device_handover.receive_for(service, "n")  # nothing queued at all


def test_a_header_the_parser_cannot_take_is_dropped_with_its_descriptors(pair) -> None:
    """60,000 nested lists are within the header's size, and made json raise RecursionError: it escaped the judge's
    handling of a refused output (`evaluator_error`, no penalty) and left the message's descriptors open (red team)."""
    service, worker = pair
    fds = _pipe_fds()
    worker.sendmsg([b"[" * 60_000], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    device_handover.close_all(fds)
    _refused_and_closed(service, "no handover message")


def test_more_descriptors_than_a_handover_takes_are_closed_by_the_kernel(pair) -> None:
    service, worker = pair
    many = [os.open("/dev/null", os.O_RDONLY) for _ in range(device_handover.MAX_TENSORS + 40)]
    device_handover.send(worker, {"nonce": "n"}, many)
    device_handover.close_all(many)
    _refused_and_closed(service, None)


def test_the_timer_waits_for_the_service_s_message_only_so_long(pair) -> None:
    service, worker = pair
    with pytest.raises(device_handover.HandoverError, match="no handover came"):
        device_handover.receive(worker, 0.2)
    service.send(json.dumps({"check": 3}).encode())
    assert device_handover.receive(worker, 5) == ({"check": 3}, [])
    service.send(b"[]")
    with pytest.raises(device_handover.HandoverError, match="not a message"):
        device_handover.receive(worker, 5)


def test_a_header_over_the_limit_is_not_sent(pair) -> None:
    _, worker = pair
    with pytest.raises(device_handover.HandoverError, match="size limit"):
        device_handover.send(worker, {"pad": "x" * device_handover.MAX_HEADER_BYTES}, [])


# An exporting worker: the output is drawn from a seed, exported and sent on the socket it is given; it waits for a
# byte before it exits (an allocation outlives its exporter only while a descriptor of it is open).
EXPORTER = """
import socket, sys
import torch
from services.evaluator import device_handover
sock = socket.socket(fileno=int(sys.argv[1]))
torch.manual_seed(int(sys.argv[2]))
outputs = [torch.randn(1 << 20, device="cuda"), torch.randn(3, 5, dtype=torch.complex64, device="cuda").conj(),
           torch.rand(7, device="cuda") > 0.5, torch.randn(4, 4, device="cuda", dtype=torch.bfloat16).t()]
exports = device_handover.Exports()
described, fds = device_handover.export(outputs, exports)
device_handover.send(sock, {"tensors": described}, fds)
device_handover.close_all(fds)
sock.recv(1)
"""


def _expected(seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [
        torch.randn(1 << 20, device="cuda"),
        torch.randn(3, 5, dtype=torch.complex64, device="cuda").conj(),
        torch.rand(7, device="cuda") > 0.5,
        torch.randn(4, 4, device="cuda", dtype=torch.bfloat16).t(),
    ]


def _exported_and_copied(prefix: list[str]) -> list[torch.Tensor]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    script = Path(tempfile.mkdtemp()) / "exporter.py"
    script.parent.chmod(0o755)  # read by the uid of the other side of strict isolation too
    script.write_text(EXPORTER)
    script.chmod(0o644)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [*prefix, sys.executable, str(script), str(child.fileno()), "7"], pass_fds=(child.fileno(),), env=env
    )
    child.close()
    try:
        header, fds = device_handover.receive(parent, 120)
        assert all(device_handover.is_device_handle(fd) for fd in fds)
        likes = _expected(7)
        try:
            return [
                device_handover.import_copy(fd, item, like)
                for fd, item, like in zip(fds, header["tensors"], likes, strict=True)
            ]
        finally:
            device_handover.close_all(fds)
    finally:
        parent.send(b"x")
        proc.wait(60)
        parent.close()
        shutil.rmtree(script.parent)


@pytest.mark.gpu
@needs_cuda
def test_an_output_exported_in_one_process_is_copied_exactly_in_another() -> None:
    copies = _exported_and_copied([])
    for copy, want in zip(copies, _expected(7), strict=True):
        assert copy.dtype == want.dtype and copy.shape == want.shape and copy.is_contiguous()
        assert torch.equal(copy, want.resolve_conj())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_the_handover_crosses_pid_namespaces_and_uids_as_strict_isolation_has_them() -> None:
    copies = _exported_and_copied(["unshare", "--pid", "--fork", "--mount-proc", "--setuid", "65534"])
    assert all(torch.equal(c, w.resolve_conj()) for c, w in zip(copies, _expected(7), strict=True))


@pytest.mark.gpu
@needs_cuda
def test_the_timer_maps_nothing_but_an_allocation_the_size_of_its_own_output() -> None:
    exports = device_handover.Exports()
    small = torch.arange(1 << 10, dtype=torch.float32, device="cuda")
    described, fds = device_handover.export([small], exports)
    try:
        larger = torch.empty(1 << 22, device="cuda")  # 16 MiB: beyond the exported allocation
        with pytest.raises(device_handover.HandoverError, match="described"):
            device_handover.import_copy(fds[0], described[0], larger)
        forged = {**described[0], "nbytes": larger.numel() * 4, "size": device_handover.allocation_size(1 << 24, 0)}
        with pytest.raises(device_handover.HandoverError, match="cuMem"):
            device_handover.import_copy(fds[0], forged, larger)
        # The device is still usable, and the right description still reads the allocation.
        assert torch.equal(device_handover.import_copy(fds[0], described[0], small), small)
    finally:
        device_handover.close_all(fds)
        exports.release()
