"""A cgroup per worker, where the host lets the service make one: the kernel's own count of a job's memory and CPU.

Without one (and for the jobs pool._counted_by_cgroup leaves to it), the memory watch (pool.MemoryWatch) adds up
the resident sets of a job's processes; without one the judge's CPU clock adds up their CPU clocks
(evaluation._cpu_clocks). Both miss what no live process shows: pages of a
shared mapping or a memfd that no page table maps any more, files in a tmpfs, and the CPU time of a helper that
exits before the judge reads its clock; and the sum counts a page that forked processes share once for each of
them. A memory cgroup charges every page to the group that touched it first, whoever maps it later, and
the kernel kills the job (out of memory) at the limit; the group's CPU counter keeps the time of every process that
ran in it, the exited ones too.

The worker joins its group first thing (sandbox.enter), before any job's code runs, so every process the job starts
is born in it; the service checks that when the worker is ready. A job's processes cannot leave: the group's files
belong to root, and in strict isolation a job runs under another uid. In `process` isolation the service is not
root, so it makes no groups (unless the host delegated it a cgroup v2 subtree) and the watch and per-process clocks
are all there is.

Where the host has the `cpu` controller, each group is also scheduled as one: a job's share of the CPU is its
group's, however many processes it starts (a red-team job with 110 busy loops, each in a session of its own, which
defeats the kernel's per-session fairness, held back a concurrent evaluation's workers for over two minutes, until
their start timed out). A group's weight stands in for the nice value within it: an idle worker's group weighs a
tenth of a taken one's, as nice 10 does against nice 0, so that workers starting in the background stay behind
the evaluations that run (`JobCgroup.weigh`, which the pool calls when it takes a worker).

Both cgroup versions: v2 (one hierarchy, with `memory` enabled for the groups and `cpu` where the service's group
can give it; the CPU counter, `cpu.stat`, is there without it) and v1 (the `memory` and `cpuacct` hierarchies, and
`cpu`, mounted with `cpuacct` or apart).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PARENT_PREFIX = "kernel-agent-evaluator-"
# A group's CPU weight while its worker waits idle, and once taken: about nice 10 against nice 0 (v2 `cpu.weight`,
# v1 `cpu.shares`, whose defaults are the taken ones).
IDLE_WEIGHT = {"cpu.weight": "10", "cpu.shares": "102"}
TAKEN_WEIGHT = {"cpu.weight": "100", "cpu.shares": "1024"}
# Tries at removing a job's group: its processes were killed, but the last may not be reaped yet.
REMOVE_TRIES = 50


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in the v2 hierarchy (None) or in the v1 hierarchy of `controller`."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (controller in controllers.split(",")):
            return path
    raise OSError(f"no cgroup of this process for {controller or 'cgroup v2'}")


def _own_dir(controller: str | None) -> Path | None:
    """This process's cgroup directory in the v2 hierarchy (None) or the v1 hierarchy of `controller`: where that
    hierarchy is mounted (/proc/self/mountinfo), joined with the process's path below the mount's root; or the
    mount point itself where that is the directory that lists this process (a container that mounts only its own
    subtree, its /proc/self/cgroup seen from outside)."""
    path = _own_path(controller)
    pid = str(os.getpid())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        fstype, _, super_options = rest.split()[:3]
        root, mount_point = fields.split()[3:5]
        if (controller is None and fstype == "cgroup2") or (
            fstype == "cgroup" and controller in super_options.split(",")
        ):
            below = os.path.relpath(path, root)
            for directory in (Path(mount_point) / below, Path(mount_point)):
                with contextlib.suppress(OSError):
                    if pid in (directory / "cgroup.procs").read_text().split():
                        return directory
    return None


def _words(path: Path) -> set[str]:
    """The words of a cgroup file; none where it does not exist (above the hierarchy's mount)."""
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _counter(text: str, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (`memory.events`, `cpu.stat`, `memory.oom_control`)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


@dataclass
class JobCgroup:
    """One worker's group: one directory (v2) or one per hierarchy (v1: memory, cpuacct, cpu). `cpu_dir` counts its
    CPU time; `sched_dir`, where the host has the `cpu` controller, schedules it."""

    memory_dir: Path
    cpu_dir: Path
    v2: bool
    memory_limit_mb: int = 0
    sched_dir: Path | None = None

    @property
    def dirs(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(d for d in (self.memory_dir, self.cpu_dir, self.sched_dir) if d is not None))

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The files the worker writes its pid to, to join the group (every hierarchy on v1)."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def weigh(self, weights: dict[str, str]) -> None:
        """Set the group's CPU weight (IDLE_WEIGHT, TAKEN_WEIGHT), where it is scheduled as a group."""
        if self.sched_dir is not None:
            name = "cpu.weight" if self.v2 else "cpu.shares"
            (self.sched_dir / name).write_text(weights[name])

    def member_pids(self) -> set[int]:
        """The processes in the group (in every hierarchy of it)."""
        sets = [{int(p) for p in Path(f).read_text().split()} for f in self.procs_files]
        return set.intersection(*sets)

    def cpu_s(self) -> float:
        """CPU seconds every process of the group has used, those that exited included (up to a scheduler tick of
        a thread that is running as it is read)."""
        if self.v2:
            return _counter((self.cpu_dir / "cpu.stat").read_text(), "usage_usec") / 1e6
        return int((self.cpu_dir / "cpuacct.usage").read_text()) / 1e9

    def oom_kills(self) -> int:
        """Processes of the group the kernel killed at its memory limit."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        return _counter((self.memory_dir / name).read_text(), "oom_kill")

    def remove(self, tries: int = REMOVE_TRIES) -> bool:
        """Remove the group once its processes are gone (trying `tries` times, 20 ms apart); whether it is gone."""
        for directory in self.dirs:
            for attempt in range(tries):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt + 1 < tries:
                        time.sleep(0.02)
            else:
                return False
        return True


class JobCgroups:
    """The service's parent group(s), under its own cgroup (on v2, or the nearest above it that gives children the
    controllers); makes one JobCgroup per worker and removes it after."""

    def __init__(
        self, memory_parent: Path, cpu_parent: Path, v2: bool, memory_limit_mb: int, sched_parent: Path | None = None
    ) -> None:
        self.memory_parent, self.cpu_parent, self.v2 = memory_parent, cpu_parent, v2
        self.memory_limit_mb = memory_limit_mb
        self.sched_parent = sched_parent
        # Groups whose last process was still going when the worker was disposed of (a CUDA context can take
        # seconds to tear down): tried again at every new group, and at close.
        self.lingering: list[JobCgroup] = []

    @classmethod
    def create(cls, memory_limit_mb: int) -> JobCgroups | None:
        """The service's groups, or None (logged) where the host gives it none: not root and nothing delegated, no
        cgroup v2 at or above the service's own that gives its children `memory` (or can be made to: one
        that holds processes cannot), and no v1 `memory` and `cpuacct` hierarchies."""
        reasons = []
        for version, make in (("v2", cls._create_v2), ("v1", cls._create_v1)):
            try:
                made = make(memory_limit_mb)
            except (OSError, ValueError) as error:
                reasons.append(f"{version}: {error}")
                continue
            if made is not None:
                return made
            reasons.append(f"{version}: not mounted, or without the controllers")
        log.warning("no cgroup per job (%s): memory and CPU are counted per live process only", "; ".join(reasons))
        return None

    @classmethod
    def _create_v2(cls, memory_limit_mb: int) -> JobCgroups | None:
        own = _own_dir(None)
        if own is None:
            return None
        # The nearest group at or above the service's own whose children get `memory`; else the service's own
        # group, enabling it there (refused where that group holds processes and is not a root).
        base = next((d for d in (own, *own.parents) if "memory" in _words(d / "cgroup.subtree_control")), None)
        if base is None:
            (own / "cgroup.subtree_control").write_text("+memory")
            base = own
        _remove_stale(base)
        parent = base / f"{PARENT_PREFIX}{os.getpid()}"
        parent.mkdir()
        (parent / "cgroup.subtree_control").write_text("+memory")
        try:
            (parent / "cgroup.subtree_control").write_text("+cpu")
        except OSError as error:  # `cpu` not given to the service's group: jobs are scheduled by process
            log.warning("no CPU weight per job (cgroup v2 `cpu` controller: %s)", error)
            return cls(parent, parent, True, memory_limit_mb)
        return cls(parent, parent, True, memory_limit_mb, sched_parent=parent)

    @classmethod
    def _create_v1(cls, memory_limit_mb: int) -> JobCgroups | None:
        parents = {}
        for controller in ("memory", "cpuacct", "cpu"):
            try:
                own = _own_dir(controller)
            except OSError:
                own = None
            if own is None:
                if controller == "cpu":  # scheduled by process
                    log.warning("no CPU weight per job: no cgroup v1 `cpu` hierarchy")
                    continue
                return None
            _remove_stale(own)
            parents[controller] = own / f"{PARENT_PREFIX}{os.getpid()}"
        for parent in dict.fromkeys(parents.values()):
            parent.mkdir()
        return cls(parents["memory"], parents["cpuacct"], False, memory_limit_mb, sched_parent=parents.get("cpu"))

    def make(self, name: str) -> JobCgroup:
        """A new, empty group with the memory limit (no swap beyond it)."""
        self.lingering = [old for old in self.lingering if not old.remove(tries=1)]
        group = JobCgroup(
            self.memory_parent / name, self.cpu_parent / name, self.v2, self.memory_limit_mb,
            self.sched_parent / name if self.sched_parent is not None else None,
        )  # fmt: skip
        for directory in group.dirs:
            directory.mkdir()
        group.weigh(IDLE_WEIGHT)
        limit = str(self.memory_limit_mb << 20)
        if self.v2:
            (group.memory_dir / "memory.max").write_text(limit)
            # A job past its limit is killed whole, not one process of it.
            (group.memory_dir / "memory.oom.group").write_text("1")
            with contextlib.suppress(FileNotFoundError):  # a kernel without swap accounting
                (group.memory_dir / "memory.swap.max").write_text("0")
        else:
            (group.memory_dir / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(FileNotFoundError):
                (group.memory_dir / "memory.memsw.limit_in_bytes").write_text(limit)
        return group

    def release(self, group: JobCgroup) -> None:
        """Remove a disposed worker's group, now or later (`lingering`)."""
        if not group.remove():
            self.lingering.append(group)

    def close(self) -> None:
        """Remove the parent group(s); the service killed every worker before."""
        for parent in dict.fromkeys(p for p in (self.memory_parent, self.cpu_parent, self.sched_parent) if p):
            _remove_tree(parent)


def _remove_tree(parent: Path) -> None:
    """Remove a parent group and the job groups in it (each once its processes are gone), or say what is left."""
    with contextlib.suppress(FileNotFoundError):
        for child in parent.iterdir():
            if child.is_dir():
                JobCgroup(child, child, True).remove()
    try:
        parent.rmdir()
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("could not remove the cgroup %s: %s", parent, error)


def _remove_stale(own: Path) -> None:
    """Parent groups that services which are gone left under `own` (their workers died with them)."""
    for parent in own.glob(f"{PARENT_PREFIX}*"):
        pid = parent.name.removeprefix(PARENT_PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove_tree(parent)
