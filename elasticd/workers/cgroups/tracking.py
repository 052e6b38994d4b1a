"""Tracking cgroups: every process a job starts on this node stays findable, and dies with the job.

A worker can leave everything the fallback looks for: its process group and session (``setsid``),
its parent (a double fork), its environment marker (``env -i``). It cannot leave its cgroup: a
fork inherits it, and moving needs write access to another ``cgroup.procs``, which only root has.
So where the daemon may create cgroups in the unified (v2) hierarchy, each worker joins one:

    ``<own>/elasticd.jobs/[<instance>/]<job>/rank_<k>``

the same leaves the v2 limit backend uses (``backends``): with v2 limits one leaf serves both.
Tracking needs no controller, so it also works on a hybrid host whose unified hierarchy has none.
As with limits, the parent opens the leaf's ``cgroup.procs`` and the child writes ``"0"`` to it
before exec (``WorkerGroup``): nothing is resolved by path after the fork.

Killing a job's processes is one write of ``"1"`` to ``cgroup.kill`` of its directory (kernel
5.14+): SIGKILL to everything below, with no race against forks. Then ``cgroup.events`` is polled
until ``populated 0`` (bounded) and the directories are removed. The same kill is used when a
group stops (``kill``, a restart, the job's end, a drain), by the reaper sidecar (a fence kills
``<base>/<job>``, the daemon's death kills ``<base>``) and by a restarted daemon (``sweep``).

Where there is no unified hierarchy, no ``cgroup.kill``, or no right to create cgroups, ``detect``
returns ``NoTracker`` and the fallback alone applies (``proctree``: descendants, process groups and
the environment marker). That fallback is kept everywhere, in addition.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

from elasticd import log
from elasticd.workers.cgroups.fs import V2_DAEMON, V2_JOBS, CgroupFs, KernelFs, remove_cgroup
from elasticd.workers.cgroups.hierarchy import own_dir, parse_mountinfo, parse_proc_cgroup
from elasticd.workers.cgroups.kill import kill_cgroup, members, remove_tree
from elasticd.workers.cgroups.limits import LimitError, check_name

_log = log.get("elasticd.tracking")

ZYGOTE_LEAF = "zygote"  # a job's zygote's leaf, beside its ranks' (never a rank_<k> name)
SNAPSHOTS_LEAF = "snapshots"  # a job's snapshot keeper's leaf (warm.snapshotkeeper), beside the zygote's
POOL_LEAF = "_zygotes"  # parked zygotes (warm.pool), beside the jobs: "_" never starts a job id


# --- one job's processes on this node ------------------------------------------------------------


class JobTracking(Protocol):
    """A job's processes on this node, from its workers' spawn until the last of them is gone."""

    def join(self, rank: int, joined: Collection[Path] = ()) -> int | None:
        """In the daemon, before the fork: make rank ``rank``'s leaf and open its ``cgroup.procs``.

        Returns the fd the child writes ``"0"`` to (the caller closes it after the spawn), or None
        when there is nothing to join: no tracking here, or the leaf is among ``joined`` (the v2
        limit placement's cgroups, which the child joins anyway). Raises ``OSError``.
        """
        ...

    def kill(self) -> list[int]:
        """SIGKILL whatever is still in the job's cgroup; returns pids that outlived the wait."""
        ...

    def close(self) -> None:
        """After ``kill`` (and after the limit placements closed): remove the job's cgroups."""
        ...

    def join_zygote(self) -> int | None:
        """Like ``join`` for the job's zygote (``workers.warm.zygote``): its own leaf beside the ranks'."""
        ...

    def drop_zygote(self) -> None:
        """The job ended here: kill what is left in the zygote's leaf and remove it (and the job's
        cgroup, once empty)."""
        ...

    def join_snapshots(self) -> int | None:
        """Like ``join_zygote`` for the job's snapshot keeper, which outlives attempts too."""
        ...

    def drop_snapshots(self) -> None:
        """Like ``drop_zygote`` for the keeper's leaf."""
        ...

    def ranks(self) -> JobTracking:
        """The ranks' leaves alone: what a worker group kills and removes while the job's zygote,
        which outlives attempts, stays (the whole job's cgroup goes when the job ends here)."""
        ...


class CgroupJob:
    """``<base>/<job>``, with one leaf per rank below it."""

    def __init__(self, fs: CgroupFs, path: Path) -> None:
        self.path = path
        self._fs = fs

    def join(self, rank: int, joined: Collection[Path] = ()) -> int | None:
        leaf = self.path / f"rank_{int(rank)}"
        if leaf in joined:
            return None
        with contextlib.suppress(FileExistsError):
            self._fs.mkdir(self.path)
        try:
            self._fs.mkdir(leaf)
        except FileExistsError:  # an earlier attempt's, which stop() could not remove: start clean
            kill_cgroup(self._fs, leaf)
            remove_tree(self._fs, leaf)
            self._fs.mkdir(leaf)
        return self._fs.open_procs(leaf)

    def kill(self) -> list[int]:
        if kill_cgroup(self._fs, self.path):
            return []
        left = members(self._fs, self.path)
        _log.error("tracking.unkillable", cgroup=str(self.path), pids=left)
        return left

    def close(self) -> None:
        if not remove_tree(self._fs, self.path):
            _log.warning("tracking.cgroup_busy", cgroup=str(self.path))

    def join_zygote(self) -> int | None:
        return self._join_leaf(ZYGOTE_LEAF)

    def drop_zygote(self) -> None:
        self._drop_leaf(ZYGOTE_LEAF)

    def join_snapshots(self) -> int | None:
        return self._join_leaf(SNAPSHOTS_LEAF)

    def drop_snapshots(self) -> None:
        self._drop_leaf(SNAPSHOTS_LEAF)

    def _join_leaf(self, name: str) -> int:
        leaf = self.path / name
        with contextlib.suppress(FileExistsError):
            self._fs.mkdir(self.path)
        with contextlib.suppress(FileExistsError):
            self._fs.mkdir(leaf)
        return self._fs.open_procs(leaf)

    def _drop_leaf(self, name: str) -> None:
        leaf = self.path / name
        if not kill_cgroup(self._fs, leaf) or not remove_tree(self._fs, leaf):
            _log.warning("tracking.cgroup_busy", cgroup=str(leaf))
        if self.path.is_dir() and not any(p.is_dir() for p in self.path.iterdir()):
            remove_cgroup(self._fs, self.path, tries=1)

    def ranks(self) -> CgroupRanks:
        return CgroupRanks(self._fs, self.path)


class CgroupRanks:
    """The ``rank_<k>`` leaves of a job's cgroup (``JobTracking.ranks``)."""

    def __init__(self, fs: CgroupFs, path: Path) -> None:
        self._job = CgroupJob(fs, path)
        self._fs = fs

    def _leaves(self) -> list[Path]:
        path = self._job.path
        return sorted(p for p in path.glob("rank_*") if p.is_dir()) if path.is_dir() else []

    def join(self, rank: int, joined: Collection[Path] = ()) -> int | None:
        return self._job.join(rank, joined)

    def kill(self) -> list[int]:
        left: list[int] = []
        for leaf in self._leaves():
            if not kill_cgroup(self._fs, leaf):
                left += members(self._fs, leaf)
        if left:
            _log.error("tracking.unkillable", cgroup=str(self._job.path), pids=left)
        return left

    def close(self) -> None:
        for leaf in self._leaves():
            if not remove_tree(self._fs, leaf):
                _log.warning("tracking.cgroup_busy", cgroup=str(leaf))

    def join_zygote(self) -> int | None:
        return self._job.join_zygote()

    def drop_zygote(self) -> None:
        self._job.drop_zygote()

    def join_snapshots(self) -> int | None:
        return self._job.join_snapshots()

    def drop_snapshots(self) -> None:
        self._job.drop_snapshots()

    def ranks(self) -> CgroupRanks:
        return self


class NoJobTracking:
    """No tracking cgroup: the fallback (``proctree``) alone finds the job's processes."""

    def join(self, rank: int, joined: Collection[Path] = ()) -> int | None:
        return None

    def kill(self) -> list[int]:
        return []

    def close(self) -> None:
        return None

    def join_zygote(self) -> int | None:
        return None

    def drop_zygote(self) -> None:
        return None

    def join_snapshots(self) -> int | None:
        return None

    def drop_snapshots(self) -> None:
        return None

    def ranks(self) -> NoJobTracking:
        return self


# --- this daemon's part of the host --------------------------------------------------------------


class Tracker(Protocol):
    name: str  # "cgroup2" or "none"

    @property
    def base(self) -> Path | None:
        """The cgroup holding every job of this daemon (None without tracking); the reaper kills it."""
        ...

    def job(self, job_id: str) -> JobTracking: ...

    def sweep(self) -> tuple[Path, ...]:
        """At start, before any worker of ours runs: kill and remove what a predecessor left.

        Returns the job cgroups removed.
        """
        ...

    def release(self) -> None:
        """On a clean stop, after every worker is gone: remove this daemon's (empty) cgroups."""
        ...

    def pool_procs(self) -> int | None:
        """The parked zygotes' leaf ``<base>/_zygotes`` (made if needed): its ``cgroup.procs``,
        opened for the daemon to write a pid to (the caller closes it). Raises ``OSError``."""
        ...

    def drop_pool(self) -> None:
        """The pool is closed: kill what is left in its leaf and remove it."""
        ...


class CgroupTracker:
    name = "cgroup2"

    def __init__(self, base: Path, fs: CgroupFs) -> None:
        self._base = base
        self._fs = fs

    @property
    def base(self) -> Path:
        return self._base

    def job(self, job_id: str) -> CgroupJob:
        return CgroupJob(self._fs, self._base / check_name("job_id", job_id))

    def sweep(self) -> tuple[Path, ...]:
        if not self._base.is_dir():
            return ()
        if not kill_cgroup(self._fs, self._base):
            _log.error("tracking.unkillable", cgroup=str(self._base), pids=members(self._fs, self._base))
        removed = []
        for job in sorted(p for p in self._base.iterdir() if p.is_dir()):
            if remove_tree(self._fs, job):
                removed.append(job)
                _log.info("tracking.swept", cgroup=str(job))
            else:
                _log.warning("tracking.cgroup_busy", cgroup=str(job))
        return tuple(removed)

    def release(self) -> None:
        if remove_cgroup(self._fs, self._base) and self._base.parent.name == V2_JOBS:
            remove_cgroup(self._fs, self._base.parent)  # busy while other daemons of this host use it

    def pool_procs(self) -> int:
        leaf = self._base / POOL_LEAF
        with contextlib.suppress(FileExistsError):
            self._fs.mkdir(leaf)
        return self._fs.open_procs(leaf)

    def drop_pool(self) -> None:
        leaf = self._base / POOL_LEAF
        if not kill_cgroup(self._fs, leaf) or not remove_tree(self._fs, leaf):
            _log.warning("tracking.cgroup_busy", cgroup=str(leaf))


class NoTracker:
    name = "none"

    @property
    def base(self) -> None:
        return None

    def job(self, job_id: str) -> NoJobTracking:
        return NoJobTracking()

    def sweep(self) -> tuple[Path, ...]:
        return ()

    def release(self) -> None:
        return None

    def pool_procs(self) -> None:
        return None

    def drop_pool(self) -> None:
        return None


def detect(
    *,
    instance: str = "",
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
    fs: CgroupFs | None = None,
) -> Tracker:
    """Tracking cgroups below this process's v2 cgroup if it may create them there, else NoTracker.

    Call it after ``limits.detect`` (which may move the daemon into ``elasticd.daemon``): both then
    agree on ``<own>``. ``instance`` (the node id) keeps several daemons of one host apart.
    """
    if instance:
        check_name("instance", instance)
    cgfs = fs if fs is not None else KernelFs()
    try:
        base = _prepare(cgfs, instance, proc_cgroup, mountinfo)
    except (OSError, LimitError) as exc:
        why = exc.message if isinstance(exc, LimitError) else f"{exc.filename}: {exc.strerror}"
        _log.info("tracking.backend", backend=NoTracker.name, why=why)
        return NoTracker()
    _log.info("tracking.backend", backend=CgroupTracker.name, cgroup=str(base))
    return CgroupTracker(base, cgfs)


def _prepare(fs: CgroupFs, instance: str, proc_cgroup: Path, mountinfo: Path) -> Path:
    """The base cgroup, created, with a child made (and checked for ``cgroup.kill``) and removed."""
    own = own_dir(parse_mountinfo(mountinfo.read_text()), parse_proc_cgroup(proc_cgroup.read_text()), None)
    if own is None:
        raise LimitError("no unified (v2) cgroup hierarchy mounted")
    if own.name == V2_DAEMON:  # moved there by the v2 limit backend: jobs live beside it
        own = own.parent
    levels = (own / V2_JOBS, own / V2_JOBS / instance) if instance else (own / V2_JOBS,)
    created: list[Path] = []
    try:
        for level in levels:
            with contextlib.suppress(FileExistsError):
                fs.mkdir(level)
                created.append(level)
        probe = levels[-1] / f"_probe-{os.getpid()}"  # names starting with "_" are never job ids
        with contextlib.suppress(FileExistsError):
            fs.mkdir(probe)
        killable = (probe / "cgroup.kill").exists()
        fs.rmdir(probe)
        if not killable:
            raise LimitError(f"no cgroup.kill in {levels[-1]} (kernel older than 5.14)")
    except (OSError, LimitError):
        for level in reversed(created):
            remove_cgroup(fs, level)
        raise
    return levels[-1]
