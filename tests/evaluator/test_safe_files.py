"""Reads of worker-written files that a symlink, hard link, FIFO or growing file cannot redirect or blow up."""

from __future__ import annotations

import os
import stat
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from services.evaluator import safe_files
from services.evaluator.safe_files import FileTooLargeError, copy_file_beneath, open_beneath, read_file_beneath


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """tmp/home/out/0.pt holding b"data"."""
    (tmp_path / "home" / "out").mkdir(parents=True)
    (tmp_path / "home" / "out" / "0.pt").write_bytes(b"data")
    return tmp_path / "home"


def test_reads_a_regular_file_beneath_root(home: Path) -> None:
    assert read_file_beneath(home, "out/0.pt", 4) == b"data"
    assert read_file_beneath(home, Path("out") / "0.pt", 4) == b"data"
    assert read_file_beneath(home, "out/0.pt", 4, owner_uid=os.geteuid()) == b"data"
    (home / "empty").write_bytes(b"")
    assert read_file_beneath(home, "empty", 0) == b""


def test_open_beneath_returns_a_descriptor_of_the_target(home: Path) -> None:
    fd = open_beneath(home, "out", directory=True)
    try:
        assert stat.S_ISDIR(os.fstat(fd).st_mode) and "0.pt" in os.listdir(fd)
    finally:
        os.close(fd)
    fd = open_beneath(home, "out/0.pt")
    try:
        assert os.read(fd, 10) == b"data"
    finally:
        os.close(fd)


def test_symlinked_file_is_refused(home: Path) -> None:
    (home / "secret").write_bytes(b"secret")
    (home / "out" / "1.pt").symlink_to(home / "secret")
    with pytest.raises(OSError):
        read_file_beneath(home, "out/1.pt", 100)


def test_symlinked_directory_is_refused(home: Path, tmp_path: Path) -> None:
    (home / "out").rename(home / "real_out")
    (home / "out").symlink_to(home / "real_out")
    with pytest.raises(OSError):
        read_file_beneath(home, "out/0.pt", 100)
    with pytest.raises(OSError):
        os.close(open_beneath(home, "out", directory=True))
    assert read_file_beneath(home, "real_out/0.pt", 100) == b"data"


def test_symlink_in_the_middle_is_refused(home: Path, tmp_path: Path) -> None:
    (tmp_path / "home" / "a" / "b").mkdir(parents=True)
    (tmp_path / "home" / "a" / "b" / "f").write_bytes(b"ok")
    assert read_file_beneath(tmp_path, "home/a/b/f", 10) == b"ok"
    (tmp_path / "home" / "link").symlink_to(tmp_path / "home" / "a")
    with pytest.raises(OSError):
        read_file_beneath(tmp_path, "home/link/b/f", 10)


def test_symlinked_root_is_refused(home: Path, tmp_path: Path) -> None:
    (tmp_path / "root_link").symlink_to(home)
    with pytest.raises(OSError):
        read_file_beneath(tmp_path / "root_link", "out/0.pt", 10)


@pytest.mark.parametrize(
    "relative", ["", "..", "../home/out/0.pt", "out/../out/0.pt", "./out/0.pt", "out//0.pt", "/etc/passwd"]
)
def test_unsafe_components_are_refused(home: Path, relative: str) -> None:
    with pytest.raises(ValueError, match="path"):
        read_file_beneath(home, relative, 100)


def test_unsafe_path_objects_are_refused(home: Path) -> None:
    for relative in (Path("/etc/passwd"), Path("."), Path("out/../out/0.pt")):
        with pytest.raises(ValueError):
            read_file_beneath(home, relative, 100)


def test_hard_link_is_refused(home: Path, tmp_path: Path) -> None:
    (tmp_path / "other_job.pt").write_bytes(b"other")
    os.link(tmp_path / "other_job.pt", home / "out" / "1.pt")
    with pytest.raises(ValueError, match="hard links"):
        read_file_beneath(home, "out/1.pt", 100)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_owner_mismatch_is_refused(home: Path) -> None:
    os.chown(home / "out" / "0.pt", 54321, 54321)
    assert read_file_beneath(home, "out/0.pt", 100, owner_uid=54321) == b"data"
    with pytest.raises(ValueError, match="owned by uid 54321, expected 0"):
        read_file_beneath(home, "out/0.pt", 100, owner_uid=0)
    assert read_file_beneath(home, "out/0.pt", 100) == b"data"  # no owner asked for


def test_oversized_sparse_file_is_refused_before_reading(home: Path) -> None:
    with open(home / "out" / "big.pt", "wb") as handle:
        handle.truncate(2 << 30)  # 2 GiB by size, no blocks on disk
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLargeError) as raised:
            read_file_beneath(home, "out/big.pt", 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert raised.value.size == 2 << 30 and raised.value.limit == 1 << 20
    assert "out/big.pt" in str(raised.value) and str(2 << 30) in str(raised.value) and str(1 << 20) in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_size_limit_is_inclusive(home: Path) -> None:
    assert read_file_beneath(home, "out/0.pt", 4) == b"data"
    with pytest.raises(FileTooLargeError):
        read_file_beneath(home, "out/0.pt", 3)


def test_file_that_grows_while_read_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> os.stat_result:
        """The size the file had a moment ago: then the candidate appended to it."""
        values = list(real_fstat(fd))
        values[stat.ST_SIZE] = 2
        return os.stat_result(values)

    monkeypatch.setattr(safe_files.os, "fstat", stale_fstat)
    with pytest.raises(ValueError, match="grew"):
        read_file_beneath(home, "out/0.pt", 100)


def test_fifo_and_directory_are_refused_without_blocking(home: Path) -> None:
    os.mkfifo(home / "out" / "fifo")
    started = time.monotonic()
    with pytest.raises(ValueError, match="not a regular file"):
        read_file_beneath(home, "out/fifo", 100)
    with pytest.raises(ValueError, match="not a regular file"):
        read_file_beneath(home, "out", 100)
    assert time.monotonic() - started < 5


def test_large_read_is_chunked(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safe_files, "CHUNK_BYTES", 7)
    data = os.urandom(100)
    (home / "out" / "1.pt").write_bytes(data)
    assert read_file_beneath(home, "out/1.pt", 100) == data


@pytest.mark.parametrize("chunk", [7, 1 << 30])
def test_copy_makes_a_read_only_copy(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(safe_files, "CHUNK_BYTES", chunk)
    data = os.urandom(100_000)
    (home / "out" / "1.pt").write_bytes(data)
    assert copy_file_beneath(home, "out/1.pt", tmp_path / "copy.pt", 100_000) == len(data)
    assert (tmp_path / "copy.pt").read_bytes() == data
    assert stat.S_IMODE((tmp_path / "copy.pt").stat().st_mode) == 0o444


def test_copy_falls_back_when_sendfile_cannot(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sendfile(*_: object) -> int:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(safe_files.os, "sendfile", no_sendfile)
    assert copy_file_beneath(home, "out/0.pt", tmp_path / "copy.pt", 100) == 4
    assert (tmp_path / "copy.pt").read_bytes() == b"data"


def test_copy_never_overwrites_or_follows_the_destination(home: Path, tmp_path: Path) -> None:
    (tmp_path / "victim").write_bytes(b"victim")
    (tmp_path / "dest_link").symlink_to(tmp_path / "victim")
    (tmp_path / "existing").write_bytes(b"old")
    for destination in (tmp_path / "dest_link", tmp_path / "existing"):
        with pytest.raises(FileExistsError):
            copy_file_beneath(home, "out/0.pt", destination, 100)
    assert (tmp_path / "victim").read_bytes() == b"victim" and (tmp_path / "existing").read_bytes() == b"old"


def test_copy_refuses_what_a_read_refuses(home: Path, tmp_path: Path) -> None:
    with open(home / "out" / "big.pt", "wb") as handle:
        handle.truncate(2 << 30)
    (home / "out" / "link.pt").symlink_to(home / "out" / "0.pt")
    os.link(home / "out" / "0.pt", home / "out" / "hard.pt")
    with pytest.raises(FileTooLargeError):
        copy_file_beneath(home, "out/big.pt", tmp_path / "a", 1 << 20)
    with pytest.raises(OSError):
        copy_file_beneath(home, "out/link.pt", tmp_path / "b", 100)
    with pytest.raises(ValueError, match="hard links"):
        copy_file_beneath(home, "out/hard.pt", tmp_path / "c", 100)
    assert not any((tmp_path / name).exists() for name in "abc")


def test_copy_of_a_growing_file_is_refused_and_removed(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> os.stat_result:
        values = list(real_fstat(fd))
        values[stat.ST_SIZE] = 2
        return os.stat_result(values)

    monkeypatch.setattr(safe_files.os, "fstat", stale_fstat)
    with pytest.raises(ValueError, match="grew"):
        copy_file_beneath(home, "out/0.pt", tmp_path / "copy.pt", 100)
    assert not (tmp_path / "copy.pt").exists()


def test_swapping_in_a_symlink_during_reads_never_leaks(home: Path, tmp_path: Path) -> None:
    """A worker flipping out/ between a directory and a symlink to a secret: every read gets data or an error."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "0.pt").write_bytes(b"SECRET")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            os.rename(home / "out", home / "real")
            os.symlink(tmp_path / "secret", home / "out")
            os.unlink(home / "out")
            os.rename(home / "real", home / "out")
            time.sleep(0.0001)  # the real directory stays a moment, so some reads must succeed

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        seen = set()
        reads = 0
        deadline = time.monotonic() + 60
        # At least 2000 reads, and on until one got the data (a loaded machine can schedule all 2000 in swaps).
        while reads < 2000 or (b"data" not in seen and time.monotonic() < deadline):
            reads += 1
            try:
                seen.add(read_file_beneath(home, "out/0.pt", 100))
            except (OSError, ValueError):
                seen.add(b"refused")
    finally:
        stop.set()
        flipper.join()
    assert b"SECRET" not in seen and b"data" in seen
