"""A seccomp filter every worker installs last in sandbox.enter(): sockets of the unix and inet families only, and
no io_uring.

Why: the receive queues of netlink sockets hold kernel memory that no memory cgroup is charged for and that no
process's resident set shows. A red-team candidate queued 4 GiB in `NETLINK_USERSOCK` sockets (its own network
namespace is enough) against a 2 GiB limit and scored `correct`; nothing bounded it but the host's memory. A job has
no use for netlink or the other families (its network namespace has no interface). io_uring can create sockets
without the `socket` system call (IORING_OP_SOCKET), so it goes too, as in Docker's default profile.

The filter is classic BPF over `struct seccomp_data`, loaded with prctl(PR_SET_SECCOMP): no library is needed, and
the filter is a dozen instructions. It is inherited by every child and cannot be removed. A system call of another
ABI than the process's own (i386 through `int 0x80`, x32 on x86-64, whose `socketcall` or numbering would miss the
check) fails with ENOSYS.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import socket

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
# Classic BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K.
LOAD_WORD, JUMP_IF_EQUAL, JUMP_IF_AT_LEAST, RETURN = 0x20, 0x15, 0x35, 0x06
# Offsets in struct seccomp_data: the call's number, its ABI, the low word of its first argument (little-endian).
NR_OFFSET, ARCH_OFFSET, FIRST_ARGUMENT_OFFSET = 0, 4, 16
X32_SYSCALL_BIT = 0x40000000
# (AUDIT_ARCH_*, socket's number) per machine; io_uring_setup, _enter and _register are 425-427 on both.
ARCHITECTURES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
IO_URING_CALLS = (425, 426, 427)
ALLOWED_SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter's instructions (code, jump if true, jump if false, k) for `machine`, top to bottom. A jump skips
    that many instructions after itself."""
    arch, socket_nr = ARCHITECTURES[machine]
    allow = (RETURN, 0, 0, SECCOMP_RET_ALLOW)
    no_such_call = (RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)
    # Another ABI than the process's own: ENOSYS.
    instructions = [(LOAD_WORD, 0, 0, ARCH_OFFSET), (JUMP_IF_EQUAL, 1, 0, arch), no_such_call]
    instructions.append((LOAD_WORD, 0, 0, NR_OFFSET))
    if machine == "x86_64":  # x32 numbers carry this bit
        instructions += [(JUMP_IF_AT_LEAST, 0, 1, X32_SYSCALL_BIT), no_such_call]
    # io_uring: each check jumps to the ENOSYS after the last; the last one's "false" skips that return.
    last = len(IO_URING_CALLS) - 1
    instructions += [(JUMP_IF_EQUAL, last - i, int(i == last), nr) for i, nr in enumerate(IO_URING_CALLS)]
    instructions.append(no_such_call)
    # Any call but socket: allowed. socket: its family must be one of ours (each check jumps to the last "allow").
    instructions += [(JUMP_IF_EQUAL, 1, 0, socket_nr), allow, (LOAD_WORD, 0, 0, FIRST_ARGUMENT_OFFSET)]
    families = len(ALLOWED_SOCKET_FAMILIES)
    instructions += [(JUMP_IF_EQUAL, families - i, 0, family) for i, family in enumerate(ALLOWED_SOCKET_FAMILIES)]
    instructions += [(RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT), allow]
    return instructions


def install() -> None:
    """Load the filter into the calling process (needs PR_SET_NO_NEW_PRIVS or CAP_SYS_ADMIN). A machine the filter
    does not know gets none (its socket families are then unfiltered)."""
    machine = platform.machine()
    if machine not in ARCHITECTURES:
        return
    instructions = program(machine)
    filters = (_SockFilter * len(instructions))(*(_SockFilter(*i) for i in instructions))
    prog = _SockFprog(len(instructions), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(code, code)}")
