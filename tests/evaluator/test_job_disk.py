"""Each strict job writes to a disk of its own (EVALUATOR_JOB_DISK_MB): a job that fills every byte it may write
cannot fail another evaluation through a full shared filesystem. Real strict servers whose work directory is a
small tmpfs of the test's; a filler candidate holds its disk full while an honest candidate is evaluated."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.evaluator import pool, sandbox
from tests.evaluator import sources
from tests.evaluator.conftest import evaluate_briefly, sandbox_uid_base, server_env
from tests.servers import run_service

pytestmark = pytest.mark.usefixtures("strict_only")

# Writes until its disk is full, then holds the file while other evaluations run; right otherwise.
FILLER = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os, time
descriptor = os.open("filler.bin", os.O_WRONLY | os.O_CREAT, 0o600)
block = b"x" * (1 << 20)
try:
    for _ in range(4096):
        os.write(descriptor, block)
except OSError:
    pass
time.sleep(400)
""",
)
WORK_DIR_MB = 160
# Past the uids the session's servers lease (and test_job_cgroup_start's): a server that shared a uid with an idle
# worker of another would stop and kill that worker with its own job's.
UID_OFFSET = 3300


def job_disk_server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return server_env(tmp_path / "cache", EVALUATOR_SANDBOX_UID_BASE=str(sandbox_uid_base() + UID_OFFSET), **extra)


@contextlib.contextmanager
def small_tmpfs(path: Path) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={WORK_DIR_MB}m,mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def some_disk_is_full(work: Path) -> bool:
    """Whether the work directory's filesystem, or any mounted under it (a worker's disk), is at least 90 % full."""
    points = [p for p in Path("/proc/self/mountinfo").read_text().split() if p.startswith(str(work))]
    for point in {str(work), *points}:
        with contextlib.suppress(OSError):
            stats = os.statvfs(point)
            if stats.f_blocks and stats.f_bavail <= 0.1 * stats.f_blocks:
                return True
    return False


def honest_beside_a_filler(tmp_path: Path, job_disk_mb: int) -> dict:
    """The honest candidate's result, evaluated while the filler's job holds its disk full."""
    with small_tmpfs(tmp_path / "work") as work:
        env = job_disk_server_env(tmp_path, EVALUATOR_WORK_DIR=str(work), EVALUATOR_JOB_DISK_MB=str(job_disk_mb))
        # The pool is left last: stopping the server ends the filler's request, which no one waits for.
        with (
            ThreadPoolExecutor(1) as pool,
            run_service("evaluator", env=env, log_path=tmp_path / "server.log") as url,
            httpx.Client(base_url=url, timeout=600) as http,
        ):
            assert http.get("/health").json()["details"]["isolation"] == "strict"
            filler = pool.submit(evaluate_briefly, http, FILLER, timeout_s=600)
            deadline = time.monotonic() + 300
            while not some_disk_is_full(work):
                assert time.monotonic() < deadline and not filler.done(), "the filler never filled a disk"
                time.sleep(0.2)
            honest = evaluate_briefly(http, sources.CORRECT, timeout_s=240)
            assert not filler.done(), "the filler's job ended before the honest evaluation did: no overlap"
    return honest


def test_a_job_that_fills_its_disk_fails_no_other_evaluation(tmp_path: Path) -> None:
    honest = honest_beside_a_filler(tmp_path, job_disk_mb=48)
    assert honest["status"] == "correct", honest["message"]


def test_without_a_disk_per_job_the_filler_fails_the_honest_candidate(tmp_path: Path) -> None:
    """The same scenario with job files on the shared work directory: the attack the disks close is real."""
    honest = honest_beside_a_filler(tmp_path, job_disk_mb=0)
    assert honest["status"] != "correct", honest


# Right only where its mount namespace holds no worker's disk but its own, this service's or another's: the copies
# a namespace gets when it is made would keep those jobs' files in memory for as long as this worker lives, and
# put their logs in reach wherever no tmpfs of the job's covers them.
SEES_OTHER_DISKS = sources.candidate(
    "return x.clamp_min(0) * self.scale * (1 if not OTHERS else 2)",
    prelude=f"""
import os
own = os.path.dirname(os.getcwd())
OTHERS = []
for line in open("/proc/self/mountinfo"):
    before, _, after = line.partition(" - ")
    point = before.split()[4]
    if after.split()[1] == {sandbox.JOB_DISK_SOURCE!r} and point != own and not point.startswith(own + "/"):
        OTHERS.append(point)
""",
)
# Creates more files than its disk has inodes for (16 MiB: 1,024); right only where that fails.
MANY_FILES = sources.candidate(
    "return x.clamp_min(0) * self.scale * (2 if MADE == 5000 else 1)",
    prelude="""
import os, shutil
os.mkdir("many")
MADE = 0
try:
    for MADE in range(1, 5001):
        open(f"many/{MADE}", "w").close()
except OSError:
    pass
shutil.rmtree("many")  # the worker needs inodes of its own for the outputs
""",
)


@contextlib.contextmanager
def another_services_disk() -> Iterator[Path]:
    """A worker's disk of another service on this host, where no tmpfs of a strict job covers it."""
    point = Path(tempfile.mkdtemp(prefix="ka-other-service-", dir="/srv"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0711", sandbox.JOB_DISK_SOURCE, str(point)], check=True)
    try:
        (point / "stdio.log").write_text("another job's log")
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


def test_a_worker_keeps_no_copy_of_other_disks_and_its_disk_has_few_inodes(tmp_path: Path) -> None:
    # The work directory is reached through a link, as a TMPDIR may be: mountinfo holds the resolved paths.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    env = job_disk_server_env(tmp_path, EVALUATOR_WORK_DIR=str(tmp_path / "link"), EVALUATOR_JOB_DISK_MB="16")
    with (
        another_services_disk(),
        run_service("evaluator", env=env, log_path=tmp_path / "server.log") as url,
        httpx.Client(base_url=url, timeout=600) as http,
    ):
        seen = evaluate_briefly(http, SEES_OTHER_DISKS, timeout_s=120)
        made = evaluate_briefly(http, MANY_FILES, timeout_s=120)
    assert seen["status"] == "correct", seen["message"]
    assert made["status"] == "correct", made["message"]
    left = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in line]
    assert not left, left  # every disk detached when its worker went, and the probe's at start


def test_unset_a_disk_per_job_is_on_where_the_work_directory_is_a_tmpfs(tmp_path: Path) -> None:
    """Its files are memory there either way; elsewhere (a disk's filesystem, as tmp_path is here) it stays off."""
    assert sandbox.filesystem_type(tmp_path) != "tmpfs"
    sizes = []
    with small_tmpfs(tmp_path / "work") as work:
        for work_dir in (work, tmp_path):
            env = job_disk_server_env(tmp_path, EVALUATOR_WORK_DIR=str(work_dir), EVALUATOR_MAX_FILE_MB="64")
            with run_service("evaluator", env=env, log_path=tmp_path / "server.log") as url:
                sizes.append(httpx.get(f"{url}/health").json()["details"]["job_disk_mb"])
    assert sizes == [4 * 64, None]


def test_a_workers_disk_is_gone_with_its_job(tmp_path: Path) -> None:
    root = tmp_path / "w0"
    root.mkdir()
    sandbox.mount_job_disk(root, 4)
    assert os.statvfs(root).f_blocks * os.statvfs(root).f_frsize == 4 << 20
    (root / "home").mkdir()
    sandbox.detach_mounts(root)
    assert os.statvfs(root).f_blocks * os.statvfs(root).f_frsize != 4 << 20
    assert not (root / "home").exists()


def test_a_link_planted_under_a_dead_services_name_is_not_followed(tmp_path: Path) -> None:
    """Anyone may write /tmp: a link named like a dead service's work directory must not lead the service to
    detach the mounts beneath its target, nor to remove what is there."""
    target = tmp_path / "target"
    (target / "mounted").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target / "mounted")], check=True)
    try:
        (target / "mounted" / "kept").write_text("kept")
        parent = tmp_path / "parent"
        parent.mkdir()
        (parent / f"{pool.WORK_DIR_PREFIX}999999999-planted").symlink_to(target)
        pool._remove_stale_work_dirs(parent)
        assert (target / "mounted" / "kept").read_text() == "kept"
    finally:
        subprocess.run(["umount", "-l", str(target / "mounted")], check=False)


# Two million floats (8 MB) in and out: a check's copy of an output is about as large as the test's disk allows.
BIG_REFERENCE = sources.REFERENCE.replace("torch.randn(64, 64)", "torch.randn(2_000_000)")
# Wrong; each output it saves for a check becomes a sparse file of the largest size the judge copies (2 x the
# output's bytes + 1 MiB): nothing on its own disk, but more than the timer's disk holds once copied.
PADDED_WRONG = sources.candidate(
    """
y = x.clamp_min(0) * self.scale + 1.0
PAD["size"] = 2 * y.numel() * y.element_size() + (1 << 20)
return y
""",
    prelude="""
import os
import torch.serialization as serialization

PAD = {}
exit_writer = serialization._open_zipfile_writer_file.__exit__


def padded_exit(self, *args):
    exit_writer(self, *args)
    if "/checks/" in str(self.name) and PAD.get("size"):
        os.truncate(self.name, PAD["size"])


serialization._open_zipfile_writer_file.__exit__ = padded_exit
""",
)


def test_a_small_disk_fails_no_honest_check_and_gives_no_wrong_candidate_a_pass(tmp_path: Path) -> None:
    """16 MiB disks and 8 MB outputs, outputs checked in files (the `drawn` data path, a GPU's, forced here): an
    honest candidate timed over many checks stays `correct` (each check's file went on piling up on its disk), and a
    wrong one that inflates the copy the timer's disk receives gets no `evaluator_error` (no penalty)."""
    assert "torch.randn(2_000_000)" in BIG_REFERENCE
    env = job_disk_server_env(
        tmp_path, EVALUATOR_WORK_DIR=str(tmp_path), EVALUATOR_JOB_DISK_MB="16", EVALUATOR_DATA_PATH="drawn"
    )
    with (
        run_service("evaluator", env=env, log_path=tmp_path / "server.log") as url,
        httpx.Client(base_url=url, timeout=600) as http,
    ):
        honest = evaluate_briefly(http, sources.CORRECT, reference=BIG_REFERENCE, timeout_s=180, timing_trials=10)
        padded = evaluate_briefly(http, PADDED_WRONG, reference=BIG_REFERENCE, timeout_s=180, correctness_trials=1)
    assert padded["status"] in ("incorrect", "rejected"), padded
    assert honest["status"] == "correct", honest["message"]


def test_files_on_a_job_disk_count_against_its_memory_where_no_cgroup_does(tmp_path: Path) -> None:
    """A job disk is memory (a tmpfs). Where jobs have no cgroup (EVALUATOR_JOB_CGROUPS=false, or compose, whose
    /sys/fs/cgroup is read-only), the memory watch counts the job's files there with its resident memory: the
    candidate above scored `correct` with 1.5 GB of files against a 1 GiB limit. An honest candidate stays right."""
    env = job_disk_server_env(
        tmp_path, EVALUATOR_WORK_DIR=str(tmp_path), EVALUATOR_JOB_DISK_MB="2048", EVALUATOR_JOB_CGROUPS="false",
        EVALUATOR_MEMORY_LIMIT_MB="1024",
    )  # fmt: skip
    with (
        run_service("evaluator", env=env, log_path=tmp_path / "server.log") as url,
        httpx.Client(base_url=url, timeout=600) as http,
    ):
        assert http.get("/health").json()["details"]["job_cgroups"] is None
        held = evaluate_briefly(http, sources.FILES_PAST_THE_LIMIT, timeout_s=180)
        # Untimed: what it shows is that the inputs handed over and the outputs saved are counted right.
        honest = evaluate_briefly(http, sources.CORRECT, timeout_s=180, timing_trials=0)
    assert held["status"] == "crashed", held
    assert "files on its disk" in held["message"], held["message"]
    assert honest["status"] == "correct", honest["message"]


def test_what_the_service_puts_on_a_job_disk_is_not_the_jobs(tmp_path: Path) -> None:
    root = tmp_path / "w0"
    root.mkdir()
    sandbox.mount_job_disk(root, 64)
    try:
        device = os.stat(root).st_dev
        worker = pool.Worker(proc=None, device="cpu", root=root, home=root, uid=None, disk_device=device)  # type: ignore[arg-type]
        empty = sandbox.disk_used_bytes(root, device)
        assert empty is not None
        inputs = b"i" * 3_000_001
        worker.charge_service_write(len(inputs))
        (root / "inputs.pt").write_bytes(inputs)
        assert pool._files_in_memory(worker) <= empty
        (root / "job.bin").write_bytes(b"j" * (5 << 20))
        assert 5 << 20 <= pool._files_in_memory(worker) <= (5 << 20) + empty
        worker.charge_service_write(1 << 20)  # a write that failed before it wrote anything: given back
        worker.release_service_write(1 << 20)
        assert 5 << 20 <= pool._files_in_memory(worker) <= (5 << 20) + empty
        # At the job's end (Worker.finish), the files it left count against its limit whatever the watch saw: a job
        # that ended within one of its periods scored `correct` with 1.5 GB of files against 1 GiB in compose.
        worker.memory_limit_mb = 6
        worker.note_files_past_limit()
        assert worker.killed_for is None
        worker.memory_limit_mb = 4
        worker.note_files_past_limit()
        assert worker.killed_for is not None and "files on its disk" in worker.killed_for
    finally:
        sandbox.detach_mounts(root)
    # Detached (its worker disposed of while the watch read it): what is below is not the job's.
    assert pool._files_in_memory(worker) == 0
