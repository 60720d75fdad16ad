"""A checked output handed from a candidate's worker to the reference's timer in GPU memory, not through a file.

The judge checks a candidate's output in the reference's timer (runner.check_saved_output). Through a file that
took the candidate's worker a copy to pageable host memory and a `torch.save`, the service a copy, and the timer a
load and a copy back to the GPU: 6 s for one 2 GiB output on an H200, most of a large KernelBench problem's
evaluation (a checked call after every timed block, every correctness trial). Here the worker copies
each output tensor's raw bytes into a CUDA virtual-memory allocation of its own (`cuMemCreate`), exports it as a
POSIX file descriptor (`cuMemExportToShareableHandle`) and sends the descriptor over a unix socket the service gave
it; the service passes it on to the timer, which maps the allocation read-only and copies it to memory of its own
(2 ms for 2 GiB). Legacy CUDA IPC handles (what torch.multiprocessing shares) cannot cross the pid namespaces of
strict isolation; a descriptor passed over a socket can.

Nothing of this is trusted more than the file was. The candidate's process may send anything on its socket at any
time: the service takes only the message carrying the nonce of the save it asked for, only descriptors of NVIDIA's
control device (what an exported allocation is), and closes the rest. The timer maps nothing larger than the
output its own model produced (shape and dtype must be the reference's, the size the one an allocation of those
bytes has), and it hashes and compares its own copy: the candidate's GPU work may still write the allocation (a
stopped process's kernels run on), but not the copy, whose sketch must be the one the block's reply committed to.
Where the export fails (a GPU or driver without POSIX-descriptor allocations, an output this path does not take)
the worker saves a file as before.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import functools
import json
import os
import socket
import stat
from dataclasses import dataclass, field
from typing import Any

import torch

from services.evaluator import output_digest

# Tensors one handover takes (the kernel passes at most 253 descriptors in one message); more go through a file.
MAX_TENSORS = 64
# Bytes of a handover message's JSON header.
MAX_HEADER_BYTES = 64 << 10
# Messages the service reads from a candidate's socket looking for the one it asked for; the socket's buffer
# bounds what is queued anyway.
MAX_MESSAGES = 256
# The character device every exported allocation's descriptor opens: NVIDIA's major number.
NVIDIA_MAJOR = 195

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ, _READ_WRITE = 1, 3  # CU_MEM_ACCESS_FLAGS_PROT_*


class HandoverError(RuntimeError):
    """A handover that could not be made or taken."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _call(name: str, *args: Any) -> None:
    driver = _driver()
    result = getattr(driver, name)(*args)
    if result != 0:
        text = ctypes.c_char_p()
        driver.cuGetErrorName(result, ctypes.byref(text))
        raise HandoverError(f"{name} failed: {(text.value or b'?').decode()} ({result})")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = _PINNED
    prop.requestedHandleTypes = _POSIX_FD
    prop.location.type = _ON_DEVICE
    prop.location.id = device
    return prop


@functools.cache
def granularity(device: int) -> int:
    """The size every allocation of this path is a multiple of, on `device`."""
    size = ctypes.c_size_t()
    _call("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(_prop(device)), 0)
    return size.value


def allocation_size(nbytes: int, device: int) -> int:
    step = granularity(device)
    return -(-nbytes // step) * step


def _map(handle: int, size: int, device: int, access: int) -> int:
    address = ctypes.c_uint64()
    _call("cuMemAddressReserve", ctypes.byref(address), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
          ctypes.c_uint64(0))  # fmt: skip
    try:
        _call("cuMemMap", address, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
              ctypes.c_uint64(0))  # fmt: skip
    except HandoverError:
        _driver().cuMemAddressFree(address, ctypes.c_size_t(size))
        raise
    desc = _AccessDesc()
    desc.location.type = _ON_DEVICE
    desc.location.id = device
    desc.flags = access
    try:
        _call("cuMemSetAccess", address, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1))
    except HandoverError:
        _unmap(address.value, size)
        raise
    return address.value


def _unmap(address: int, size: int) -> None:
    _driver().cuMemUnmap(ctypes.c_uint64(address), ctypes.c_size_t(size))
    _driver().cuMemAddressFree(ctypes.c_uint64(address), ctypes.c_size_t(size))


def _bytes_at(address: int, nbytes: int, device: int) -> torch.Tensor:
    """A uint8 tensor over `nbytes` of device memory this module mapped (it owns nothing)."""

    class Mapped:
        __cuda_array_interface__ = {  # noqa: RUF012 - read once, by torch.as_tensor
            "shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3, "strides": None,
        }  # fmt: skip

    return torch.as_tensor(Mapped(), device=f"cuda:{device}")


@dataclass
class Exports:
    """The allocations a worker exported for its last handover: released at the next one (the timer may still be
    mapping them until the judge sends the next command)."""

    handles: list[int] = field(default_factory=list)

    def release(self) -> None:
        handles, self.handles = self.handles, []
        for handle in handles:
            _driver().cuMemRelease(ctypes.c_uint64(handle))


def handover_tensors(output: Any) -> list[torch.Tensor] | None:
    """The tensors of an output this path takes (a plain CUDA tensor, or a tuple or list of at most MAX_TENSORS
    non-empty ones), or None: such an output goes through a file."""
    items = list(output) if isinstance(output, list | tuple) else [output]
    if not 0 < len(items) <= MAX_TENSORS:
        return None
    if not all(type(item) is torch.Tensor and item.is_cuda and item.numel() > 0 for item in items):
        return None
    return items


def export(tensors: list[torch.Tensor], exports: Exports) -> tuple[list[dict[str, Any]], list[int]]:
    """Copy each tensor's raw bytes into an allocation of this path and export it: the description of each
    (shape, dtype, bytes, allocation size) and the descriptors to send (the caller closes them once sent)."""
    exports.release()
    described, fds = [], []
    try:
        for tensor in tensors:
            device = tensor.device.index or 0
            data = output_digest.raw_bytes(tensor)
            nbytes = data.numel()
            size = allocation_size(nbytes, device)
            handle = ctypes.c_uint64()
            _call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(_prop(device)),
                  ctypes.c_uint64(0))  # fmt: skip
            exports.handles.append(handle.value)
            address = _map(handle.value, size, device, _READ_WRITE)
            try:
                _bytes_at(address, nbytes, device).copy_(data)
                torch.cuda.synchronize(device)
            finally:
                _unmap(address, size)
            fd = ctypes.c_int(-1)
            _call("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_uint64(handle.value), _POSIX_FD,
                  ctypes.c_uint64(0))  # fmt: skip
            fds.append(fd.value)
            described.append(
                {
                    "shape": list(tensor.shape),
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "nbytes": nbytes,
                    "size": size,
                }  # fmt: skip
            )
    except BaseException:
        close_all(fds)
        exports.release()
        raise
    return described, fds


def import_copy(fd: int, described: dict[str, Any], like: torch.Tensor) -> torch.Tensor:
    """A copy, in this process's memory on `like`'s device, of the allocation `fd` exports, read as a tensor of
    `like`'s shape and dtype (the reference's output: nothing larger is mapped). HandoverError where the
    description is not of such a tensor or the allocation cannot be mapped."""
    device = like.device.index or 0
    nbytes = like.numel() * like.element_size()
    size = allocation_size(nbytes, device)
    if described.get("nbytes") != nbytes or described.get("size") != size:
        raise HandoverError(f"an allocation described as {described!r} for an output of {nbytes} bytes")
    handle = ctypes.c_uint64()
    _call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD)
    try:
        address = _map(handle.value, size, device, _READ)
        try:
            copy = _bytes_at(address, nbytes, device).clone()
            torch.cuda.synchronize(device)
        finally:
            _unmap(address, size)
    finally:
        _driver().cuMemRelease(ctypes.c_uint64(handle.value))
    return copy.view(like.dtype).view(like.shape)


def is_device_handle(fd: int) -> bool:
    """Whether a descriptor a job sent is one an exported allocation can be: NVIDIA's character device."""
    try:
        mode = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISCHR(mode.st_mode) and os.major(mode.st_rdev) == NVIDIA_MAJOR


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def send(sock: socket.socket, header: dict[str, Any], fds: list[int]) -> None:
    """One message: the JSON header with the descriptors attached."""
    data = json.dumps(header).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise HandoverError("a handover header over the size limit")
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])


def _receive_one(sock: socket.socket, flags: int) -> tuple[Any, list[int]] | None:
    """One message and its descriptors (None: nothing queued, with MSG_DONTWAIT). A header that is not JSON, or not
    one the parser can take, reads as None (the caller closes the descriptors); descriptors the message carried
    beyond what fits are closed by the kernel (MSG_CTRUNC)."""
    space = socket.CMSG_SPACE(MAX_TENSORS * array.array("i").itemsize)
    try:
        data, ancillary, _, _ = sock.recvmsg(MAX_HEADER_BYTES, space, flags)
    except BlockingIOError:
        return None
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds += list(received)
    try:
        header = json.loads(data)
    except (ValueError, RecursionError):  # a header nested deeper than the parser goes raised RecursionError
        header = None
    return header, fds


def receive_for(sock: socket.socket, nonce: str) -> tuple[dict[str, Any], list[int]]:
    """The message a job queued for the save with `nonce` and its descriptors, each an NVIDIA device descriptor
    (the service's side: read without waiting, since the job sent it before replying). Every other message queued
    before it, and its descriptors, are dropped. HandoverError where there is none such."""
    for _ in range(MAX_MESSAGES):
        message = _receive_one(sock, socket.MSG_DONTWAIT)
        if message is None:
            break
        header, fds = message
        if type(header) is dict and header.get("nonce") == nonce:
            if not all(is_device_handle(fd) for fd in fds):
                close_all(fds)
                raise HandoverError("a handover of descriptors that are not GPU allocations")
            return header, fds
        close_all(fds)
    raise HandoverError("no handover message came with the save")


def receive(sock: socket.socket, seconds: float) -> tuple[Any, list[int]]:
    """The next message the service sent (the timer's side), waiting up to `seconds`."""
    sock.settimeout(max(seconds, 0.001))
    try:
        message = _receive_one(sock, 0)
    except TimeoutError as error:
        raise HandoverError("no handover came from the service") from error
    if message is None or type(message[0]) is not dict:
        raise HandoverError("the service's handover was not a message")
    return message
