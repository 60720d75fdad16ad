"""Reading files a sandboxed worker wrote, without letting the worker redirect the read.

A worker owns the directories it writes into, so it can swap any file or directory there for a symlink (to
another job's outputs, to /etc/shadow, to a FIFO that blocks the reader) or a hard link, between the moment the
service decides to read and the read itself. These helpers never resolve a path beneath the trusted `root`:
they walk it one component at a time with `openat(dir_fd, component, O_NOFOLLOW)`, then check what they opened
(`fstat` on the descriptor, not on the path) before reading a byte.

`root` itself is opened by path with only its last component protected by O_NOFOLLOW: its parents must be
directories the worker cannot change (e.g. the worker's home, inside a root-owned directory).
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

from services.evaluator.sandbox import tool_env

# Largest single read()/sendfile() call (Linux moves at most ~2 GiB per call anyway).
CHUNK_BYTES = 1 << 30

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; O_NOCTTY: never adopt a terminal.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class FileTooLargeError(ValueError):
    """A file is larger than the caller allows; raised before any of it is read."""

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(f"{name} is {size} bytes, larger than the limit of {limit} bytes")
        self.name, self.size, self.limit = name, size, limit


def _components(relative: str | Path) -> list[str]:
    parts = relative.split("/") if isinstance(relative, str) else list(relative.parts)
    if not parts:
        raise ValueError("empty relative path")
    for part in parts:
        if part in ("", ".", "..") or "/" in part:
            raise ValueError(f"unsafe path component {part!r} in {str(relative)!r}")
    return parts


def open_beneath(root: Path, relative: str | Path, *, directory: bool = False) -> int:
    """File descriptor of `root/relative`, opened without following a symlink at any component.

    `relative` is a `/`-separated string or a relative Path; components '', '.' and '..' are refused
    (ValueError). A symlink at `root` or anywhere beneath it raises OSError (ELOOP or ENOTDIR). The last
    component is opened read-only and non-blocking, as a directory when `directory` is true. The caller
    closes the returned descriptor.
    """
    parts = _components(relative)
    fd = os.open(root, _DIR_FLAGS)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            flags = _FILE_FLAGS if last and not directory else _DIR_FLAGS
            next_fd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _checked_regular(fd: int, name: str, max_bytes: int, owner_uid: int | None) -> os.stat_result:
    """fstat of an opened file, refused unless it is a single-linked regular file of at most `max_bytes`."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{name} is not a regular file")
    if info.st_nlink != 1:
        raise ValueError(f"{name} has {info.st_nlink} hard links, expected 1")
    if owner_uid is not None and info.st_uid != owner_uid:
        raise ValueError(f"{name} is owned by uid {info.st_uid}, expected {owner_uid}")
    if info.st_size > max_bytes:
        raise FileTooLargeError(name, info.st_size, max_bytes)
    return info


def read_file_beneath(root: Path, relative: str | Path, max_bytes: int, owner_uid: int | None = None) -> bytes:
    """Contents of the regular file `root/relative` (see `open_beneath`), of at most `max_bytes`.

    Refused (ValueError; FileTooLargeError for the size) unless it is a regular file with one link, owned by
    `owner_uid` when given, and no larger than `max_bytes` by fstat, which is checked before reading. The read
    allocates no more than the file's size; a file that grows while it is read is refused.
    """
    name = str(relative)
    fd = open_beneath(root, relative)
    try:
        info = _checked_regular(fd, name, max_bytes, owner_uid)
        parts: list[bytes] = []
        remaining = info.st_size
        while remaining > 0:
            chunk = os.read(fd, min(remaining, CHUNK_BYTES))
            if not chunk:
                break  # shrank while read: what was there is what we judge
            parts.append(chunk)
            remaining -= len(chunk)
        if os.read(fd, 1):
            raise ValueError(f"{name} grew while it was read (was {info.st_size} bytes, limit {max_bytes})")
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def copy_file_beneath(
    root: Path,
    relative: str | Path,
    destination: str | Path,
    max_bytes: int,
    owner_uid: int | None = None,
    *,
    dir_fd: int | None = None,
) -> int:
    """Copy the regular file `root/relative` (checked as by `read_file_beneath`) to a new file `destination`
    (relative to the directory `dir_fd` when given, as in os.open).

    The copy goes through the kernel in chunks (sendfile), never through one buffer of the file's size.
    `destination` must not exist (O_EXCL; a symlink there is not followed); its parent must be a directory
    the worker cannot change. It ends read-only (0o444). Returns the bytes copied; on any failure the
    partial destination is removed. A source that grows past its size at open time is refused.
    """
    name = str(relative)
    source = open_beneath(root, relative)
    try:
        info = _checked_regular(source, name, max_bytes, owner_uid)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        target = os.open(destination, flags, 0o600, dir_fd=dir_fd)
        try:
            copied = _copy_fd(source, target, info.st_size)
            if _copy_fd(source, target, 1):
                raise ValueError(f"{name} grew while it was copied (was {info.st_size} bytes, limit {max_bytes})")
            os.fchmod(target, 0o444)
        except BaseException:
            os.close(target)
            os.unlink(destination, dir_fd=dir_fd)
            raise
        os.close(target)
    finally:
        os.close(source)
    return copied


def _copy_fd(source: int, target: int, count: int) -> int:
    """Copy up to `count` bytes from the current offset of `source` to `target`; stops early at end of file."""
    copied = 0
    while copied < count:
        want = min(count - copied, CHUNK_BYTES)
        try:
            sent = os.sendfile(target, source, None, want)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            sent = _copy_chunk(source, target, min(want, 1 << 20))
        if sent == 0:
            break
        copied += sent
    return copied


def _copy_chunk(source: int, target: int, count: int) -> int:
    """read()/write() fallback where sendfile cannot copy between these two files."""
    data = os.read(source, count)
    view = memoryview(data)
    while view:
        view = view[os.write(target, view) :]
    return len(data)


def remove_tree(path: Path) -> None:
    """Remove a directory tree a worker wrote, however deep: coreutils' `rm -rf` walks it without recursion and
    never follows a symlink or leaves the file system. (shutil.rmtree recurses once per level: a job that made
    1,500 nested directories raised RecursionError through ignore_errors, which turned its verdict into
    evaluator_error, leaked its sandbox uid, and stopped the service from starting again on that work dir.) What
    cannot be removed is left, as rmtree's ignore_errors did. A service that is not root (process isolation) gives
    itself write permission on the directories first (`chmod -R` follows no link): it owns them all, but `rm` cannot
    empty one that is read-only, such as the inputs directory it handed over (0555), which was left behind with every
    input set in it."""
    if os.geteuid() != 0:
        subprocess.run(
            ["chmod", "-R", "u+rwx", "--", str(path)], check=False, stderr=subprocess.DEVNULL, env=tool_env()
        )
    subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", str(path)], check=False, stderr=subprocess.DEVNULL, env=tool_env()
    )
