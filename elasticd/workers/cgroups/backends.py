"""cgroup v2 and v1 limit backends: the daemon makes and fills each worker's leaf cgroup.

The parent opens each leaf's ``cgroup.procs`` in ``place()``; the child writes ``"0"`` to it
(the writer moves itself), so no path is resolved after the fork. The layout's directory names
and the filesystem seam (``CgroupFs``, which tests stand a plain directory in for) are ``fs``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Collection
from pathlib import Path

from elasticd import log
from elasticd.workers.cgroups.fs import BUSY, V1_JOBS, V2_DAEMON, V2_JOBS, CgroupFs, KernelFs, remove_cgroup
from elasticd.workers.cgroups.limits import (
    ChildSetup,
    LimitError,
    Placement,
    ResourceLimits,
    check_name,
    pick_cores,
)

_log = log.get("elasticd.limits")

CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's floor for a CFS quota
_CONTROLLERS = "+memory +cpu"


# --- shared mechanics ------------------------------------------------------------------------


def _ensure(fs: CgroupFs, path: Path) -> None:
    with contextlib.suppress(FileExistsError):
        fs.mkdir(path)


def _fresh(fs: CgroupFs, path: Path) -> None:
    """A new, empty leaf: one left by a crashed predecessor is removed first (resets counters)."""
    try:
        fs.mkdir(path)
    except FileExistsError:
        try:
            fs.rmdir(path)
        except OSError as exc:
            why = "still in use" if exc.errno in BUSY else exc.strerror
            raise LimitError(f"cgroup {path} is left from an earlier worker and {why}") from exc
        fs.mkdir(path)


def _release(fs: CgroupFs, base: Path) -> None:
    """A stopping daemon removes its (empty) base, and the shared parent when it is the last."""
    _sweep(fs, base, ())
    if remove_cgroup(fs, base) and base.parent.name in (V2_JOBS, V1_JOBS):
        remove_cgroup(fs, base.parent)  # busy while other daemons of this host use it: fine


def _oom_kills(fs: CgroupFs, path: Path) -> int:
    """The ``oom_kill N`` line of ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""
    for line in fs.read(path).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def _sweep(fs: CgroupFs, base: Path, alive: Collection[str]) -> list[Path]:
    removed = []
    jobs = [p for p in base.iterdir() if p.is_dir() and p.name not in alive] if base.is_dir() else []
    for job in jobs:
        for leaf in (p for p in job.iterdir() if p.is_dir()):
            remove_cgroup(fs, leaf)
        if remove_cgroup(fs, job):
            removed.append(job)
            _log.info("limits.swept", path=str(job))
        else:
            _log.warning("limits.stale_busy", path=str(job))
    return removed


class CgroupPlacement:
    """A worker's leaf cgroups (one per hierarchy) and what its child does to join them."""

    def __init__(
        self, fs: CgroupFs, setup: ChildSetup, leaves: tuple[Path, ...], oom_file: Path | None
    ) -> None:
        self.setup = setup
        self._fs = fs
        self._leaves = leaves
        self._oom_file = oom_file
        self._oom_kills: int | None = None  # read at close(), before the counters go away
        self._closed = False

    @property
    def cgroups(self) -> tuple[Path, ...]:
        return self._leaves

    def preexec(self) -> None:
        self.setup.apply()

    def oom_killed(self) -> bool:
        """True when the OOM killer killed any process of the worker's tree (counted per leaf).

        Without a memory limit there is no memory cgroup and this is False.
        """
        if self._oom_kills is None and not self._closed:
            return self._count() > 0
        return (self._oom_kills or 0) > 0

    def _count(self) -> int:
        if self._oom_file is None:
            return 0
        try:
            return _oom_kills(self._fs, self._oom_file)
        except (OSError, ValueError) as exc:
            _log.warning("limits.oom_unreadable", path=str(self._oom_file), error=str(exc))
            return 0

    def close(self) -> None:
        if self._closed:
            return
        self._oom_kills = self._count()
        self._closed = True
        for fd in self.setup.procs_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for leaf in self._leaves:
            if remove_cgroup(self._fs, leaf, tries=5):
                remove_cgroup(self._fs, leaf.parent)  # the job's directory, once its last rank is gone
            else:
                _log.warning("limits.cgroup_busy", path=str(leaf))


def _abandon(fs: CgroupFs, fds: list[int], leaves: list[Path]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    for leaf in leaves:
        if remove_cgroup(fs, leaf):
            remove_cgroup(fs, leaf.parent)


def _no_cgroup(limits: ResourceLimits) -> CgroupPlacement | None:
    """Neither memory nor CPUs limited: no cgroup, only the rlimit (nothing to clean up)."""
    if limits.memory_bytes is None and limits.cpus is None:
        return CgroupPlacement(KernelFs(), ChildSetup(nofile=limits.nofile), (), None)
    return None


# --- cgroup v2 -------------------------------------------------------------------------------


class CgroupV2Backend:
    """The unified hierarchy: ``memory.max`` (no swap), ``cpu.max``, OOM kills from ``memory.events``."""

    name = "cgroup2"

    def __init__(self, base: Path, fs: CgroupFs) -> None:
        self.base = base
        self.bases = (base,)
        self._fs = fs

    @classmethod
    def prepare(cls, own: Path, instance: str, fs: CgroupFs, move_self: bool = True) -> CgroupV2Backend:
        """Enable memory and cpu below the daemon's cgroup ``own``; raises LimitError if not allowed.

        The no-internal-processes rule: a non-root cgroup that holds processes cannot enable
        controllers for its children (EBUSY). As with systemd's ``Delegate=yes``, the daemon
        then moves itself into the leaf ``<own>/elasticd.daemon`` (and so do the children it
        starts later), leaving ``<own>`` free to delegate. This works only if the daemon was
        alone in ``<own>``, e.g. its own service; otherwise it moves back and gives up. A
        daemon already in ``elasticd.daemon`` (a restart in place) uses the parent as ``own``.
        """
        if own.name == V2_DAEMON:
            own = own.parent
        try:
            available = set(fs.read(own / "cgroup.controllers").split())
        except OSError as exc:
            raise LimitError(f"cannot read {own / 'cgroup.controllers'}: {exc}") from exc
        if not {"memory", "cpu"} <= available:
            raise LimitError(f"{own} does not offer memory and cpu (only: {' '.join(sorted(available))})")
        try:
            _enable_evacuating(fs, own, move_self)
            base = own / V2_JOBS
            for level in (base, base / instance) if instance else (base,):
                _ensure(fs, level)
                fs.write(level / "cgroup.subtree_control", _CONTROLLERS)
            base = base / instance if instance else base
            _probe_child(fs, base)
        except OSError as exc:
            raise LimitError(f"cannot delegate memory and cpu below {own}: {exc}") from exc
        return cls(base, fs)

    def place(self, job_id: str, rank: int, limits: ResourceLimits) -> Placement:
        check_name("job_id", job_id)
        plain = _no_cgroup(limits)
        if plain is not None:
            return plain
        job = self.base / job_id
        leaf = job / f"rank_{int(rank)}"
        fds: list[int] = []
        try:
            _ensure(self._fs, job)
            self._fs.write(job / "cgroup.subtree_control", _CONTROLLERS)
            _fresh(self._fs, leaf)
            if limits.memory_bytes is not None:
                self._fs.write(leaf / "memory.max", str(limits.memory_bytes))
                if (leaf / "memory.swap.max").exists():  # as v1's memsw: no escape into swap
                    self._fs.write(leaf / "memory.swap.max", "0")
                if (leaf / "memory.oom.group").exists():  # one OOM kill takes the whole tree
                    self._fs.write(leaf / "memory.oom.group", "1")
            if limits.cpus is not None:
                self._fs.write(leaf / "cpu.max", f"{_quota(limits.cpus)} {CFS_PERIOD_US}")
            fds.append(self._fs.open_procs(leaf))
        except LimitError:
            _abandon(self._fs, fds, [leaf])
            raise
        except OSError as exc:
            _abandon(self._fs, fds, [leaf])
            raise LimitError(f"cgroup {leaf}: {exc}") from exc
        setup = ChildSetup(procs_fds=tuple(fds), nofile=limits.nofile)
        return CgroupPlacement(self._fs, setup, (leaf,), leaf / "memory.events")

    def sweep(self, alive_job_ids: Collection[str]) -> tuple[Path, ...]:
        return tuple(_sweep(self._fs, self.base, alive_job_ids))

    def release(self) -> None:
        _release(self._fs, self.base)


def _enable_evacuating(fs: CgroupFs, own: Path, move_self: bool) -> None:
    try:
        fs.write(own / "cgroup.subtree_control", _CONTROLLERS)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY or not move_self:
            raise
    leaf, pid = own / V2_DAEMON, str(os.getpid())
    _ensure(fs, leaf)
    fs.write(leaf / "cgroup.procs", pid)
    try:
        fs.write(own / "cgroup.subtree_control", _CONTROLLERS)
    except OSError:
        with contextlib.suppress(OSError):
            fs.write(own / "cgroup.procs", pid)
            fs.rmdir(leaf)
        raise
    _log.info("limits.daemon_moved", cgroup=str(leaf), pid=os.getpid())


def _quota(cpus: float) -> int:
    return max(MIN_QUOTA_US, round(cpus * CFS_PERIOD_US))


def _probe_child(fs: CgroupFs, base: Path) -> None:
    """Create and remove a child: proves we may (names starting with "_" are never job ids)."""
    probe = base / f"_probe-{os.getpid()}"
    _ensure(fs, probe)
    fs.rmdir(probe)


# --- cgroup v1 -------------------------------------------------------------------------------


class CgroupV1Backend:
    """v1: the memory hierarchy (required) and the cpu hierarchy (else CPUs pin cores).

    ``memory.limit_in_bytes`` and, when swap is accounted, ``memory.memsw.limit_in_bytes`` to
    the same value (so the tree cannot escape into swap); ``cpu.cfs_quota_us`` over a 100 ms
    period. OOM kills are read from ``memory.oom_control``'s ``oom_kill`` line (kernel 4.13+).
    """

    name = "cgroup1"

    def __init__(self, memory_base: Path, cpu_base: Path | None, fs: CgroupFs) -> None:
        self.memory_base = memory_base
        self.cpu_base = cpu_base
        self.bases = (memory_base,) if cpu_base is None else (memory_base, cpu_base)
        self._fs = fs

    @staticmethod
    def prepare_base(own: Path, instance: str, fs: CgroupFs) -> Path:
        """``<own>/elasticd[/<instance>]``, created, with a child made and removed as proof."""
        base = own / V1_JOBS
        try:
            _ensure(fs, base)
            if instance:
                base = base / instance
                _ensure(fs, base)
            _probe_child(fs, base)
        except OSError as exc:
            raise LimitError(f"cannot create cgroups below {own}: {exc}") from exc
        return base

    def place(self, job_id: str, rank: int, limits: ResourceLimits) -> Placement:
        check_name("job_id", job_id)
        plain = _no_cgroup(limits)
        if plain is not None:
            return plain
        fds: list[int] = []
        leaves: list[Path] = []
        oom_file, cores = None, None
        try:
            if limits.memory_bytes is not None:
                leaf = self._leaf(self.memory_base, job_id, rank, leaves)
                self._fs.write(leaf / "memory.limit_in_bytes", str(limits.memory_bytes))
                if (leaf / "memory.memsw.limit_in_bytes").exists():  # after the limit: memsw >= limit
                    self._fs.write(leaf / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
                fds.append(self._fs.open_procs(leaf))
                oom_file = leaf / "memory.oom_control"
            if limits.cpus is not None and self.cpu_base is not None:
                leaf = self._leaf(self.cpu_base, job_id, rank, leaves)
                self._fs.write(leaf / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                self._fs.write(leaf / "cpu.cfs_quota_us", str(_quota(limits.cpus)))
                fds.append(self._fs.open_procs(leaf))
            elif limits.cpus is not None:
                cores = pick_cores(limits.cpus, rank)
        except LimitError:
            _abandon(self._fs, fds, leaves)
            raise
        except OSError as exc:
            _abandon(self._fs, fds, leaves)
            raise LimitError(f"cgroup for {job_id} rank {rank}: {exc}") from exc
        setup = ChildSetup(procs_fds=tuple(fds), nofile=limits.nofile, cores=cores)
        return CgroupPlacement(self._fs, setup, tuple(leaves), oom_file)

    def _leaf(self, base: Path, job_id: str, rank: int, leaves: list[Path]) -> Path:
        leaf = base / job_id / f"rank_{int(rank)}"
        _ensure(self._fs, leaf.parent)
        _fresh(self._fs, leaf)
        leaves.append(leaf)
        return leaf

    def sweep(self, alive_job_ids: Collection[str]) -> tuple[Path, ...]:
        return tuple(path for base in self.bases for path in _sweep(self._fs, base, alive_job_ids))

    def release(self) -> None:
        for base in self.bases:
            _release(self._fs, base)
