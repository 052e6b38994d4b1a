"""Per-worker resource limits: memory, CPUs and open files for one local rank and its whole tree.

Where the daemon may create cgroups (v2, or the v1 memory hierarchy) a worker gets a leaf
cgroup of its own, so the limit covers every process it forks and an OOM kill is counted by the
kernel: the daemon can then end the job with reason ``oom`` rather than "exit code -9".
Elsewhere it falls back to rlimits, which only approximate (per process, and OOM unobservable).

The seam with spawning is small on purpose: ``LimitBackend.place()`` runs in the daemon and does
every path lookup, mkdir and write; ``Placement.preexec()`` runs in the forked child (as root,
before the uid switch) and only makes system calls on values the parent prepared, because
between fork and exec a multi-threaded parent's locks (logging, the allocator) may be held by
threads that do not exist in the child. The cgroup backends live in ``backends``, and
``hierarchy.detect`` picks the backend a host allows.
"""

from __future__ import annotations

import math
import os
import re
import resource
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Protocol

from elasticd.errors import ElasticdError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[KMGT]?)(?P<suffix>i?B)?\s*", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class LimitError(ElasticdError):
    """A worker's limits could not be put in place: it must not start without them."""


def parse_size(text: str) -> int:
    """Bytes from ``"512M"``, ``"8G"``, ``"1.5GiB"``, ``"64m"`` or ``"1073741824"``.

    Units are binary multiples whether spelled ``K``, ``KB`` or ``KiB`` (memory is sized in
    pages, and ``ulimit``, ``docker --memory`` and ``systemd MemoryMax=`` read them the same way).
    Fractions are rounded down to whole bytes; a bare number must be whole. Raises ``ValueError``
    for anything else, including zero.
    """
    match = _SIZE.fullmatch(text)
    if match is None or (match["suffix"] and match["suffix"].lower() == "ib" and not match["unit"]):
        raise ValueError(f"not a size: {text!r} (expected e.g. 512M, 8G, 1.5GiB or a byte count)")
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"not a size: {text!r}") from exc
    multiple = _UNITS[match["unit"].upper()]
    if multiple == 1 and number != number.to_integral_value():
        raise ValueError(f"not a size: {text!r} (a byte count must be a whole number)")
    size = int(number * multiple)
    if size <= 0:
        raise ValueError(f"not a size: {text!r} (must be at least one byte)")
    return size


@dataclass(frozen=True)
class ResourceLimits:
    """Limits of one worker: its local rank's process and everything it forks.

    ``cpus`` is a share of CPU time (``1.5`` = one and a half CPUs) under cgroups, and a number
    of pinned cores (rounded up) without them.
    """

    memory_bytes: int | None = None
    cpus: float | None = None
    nofile: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"memory limit must be positive, got {self.memory_bytes}")
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise ValueError(f"cpu limit must be a positive number, got {self.cpus}")
        if self.nofile is not None and self.nofile <= 0:
            raise ValueError(f"nofile must be positive, got {self.nofile}")

    @classmethod
    def from_spec(
        cls, memory_limit_bytes: int | None, cpu_limit: float | None, nofile: int | None
    ) -> ResourceLimits:
        """From the JobSpec's three fields (already validated there), in the spec's order."""
        return cls(memory_bytes=memory_limit_bytes, cpus=cpu_limit, nofile=nofile)

    @property
    def empty(self) -> bool:
        return self.memory_bytes is None and self.cpus is None and self.nofile is None


@dataclass(frozen=True)
class ChildSetup:
    """What the forked child does before exec, all of it prepared by the parent.

    ``apply`` makes only ``write``, ``setrlimit`` and ``sched_setaffinity`` calls on ready
    values: no path lookups (a path could be replaced between place() and fork), no logging, no
    allocation-heavy work. It joins the cgroups first, so everything after is charged to them.
    A failure raises, and ``subprocess`` then reports the spawn as failed: a worker never runs
    without the limits it was given.
    """

    procs_fds: tuple[int, ...] = ()  # open cgroup.procs files: writing "0" moves the writer
    nofile: int | None = None
    address_space: int | None = None  # RLIMIT_AS, the rlimit stand-in for a memory limit
    cores: frozenset[int] | None = None

    def apply(self) -> None:
        for fd in self.procs_fds:
            os.write(fd, b"0")
        if self.nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        if self.address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (self.address_space, self.address_space))
        if self.cores is not None:
            os.sched_setaffinity(0, self.cores)


class Placement(Protocol):
    """One worker's limits, from before its fork until after its whole tree is gone."""

    @property
    def cgroups(self) -> tuple[Path, ...]:
        """The leaf cgroups the worker joins (empty without cgroups), for logs."""
        ...

    def preexec(self) -> None:
        """In the forked child, as root, before the uid switch and exec: apply the limits."""
        ...

    def oom_killed(self) -> bool:
        """After the worker exited: whether the OOM killer killed a process of its tree."""
        ...

    def close(self) -> None:
        """After the worker's tree is gone: release fds and remove its cgroups. Idempotent."""
        ...


class LimitBackend(Protocol):
    name: str  # "cgroup2", "cgroup1" or "rlimit"

    def place(self, job_id: str, rank: int, limits: ResourceLimits) -> Placement:
        """Prepare (in the daemon) the limits of local rank ``rank`` of ``job_id``.

        Raises ``LimitError`` when they cannot be put in place.
        """
        ...

    def sweep(self, alive_job_ids: Collection[str]) -> tuple[Path, ...]:
        """Remove the empty cgroups of jobs not in ``alive_job_ids`` (a crashed predecessor's).

        Call it after stale workers were killed; a cgroup that still holds processes is kept and
        logged. Returns the job directories removed.
        """
        ...

    def release(self) -> None:
        """On a clean stop, after every worker is gone: remove this daemon's (empty) cgroups."""
        ...


def check_name(what: str, name: str) -> str:
    """A job id or instance name usable as one path component (never ``..`` or a control file)."""
    if not _NAME.match(name):
        raise LimitError(f"{what} {name!r} cannot name a cgroup", **{what: name})
    return name


def pick_cores(cpus: float, rank: int, available: Collection[int] | None = None) -> frozenset[int]:
    """``ceil(cpus)`` cores for local rank ``rank``, rotated by rank so ranks spread out.

    Without cgroups a CPU share cannot be enforced; pinning bounds a worker to whole cores. It is
    not NUMA- or GPU-aware, and ranks share cores once the host runs out of them.
    """
    cores = sorted(os.sched_getaffinity(0) if available is None else available)
    count = max(1, min(len(cores), math.ceil(cpus - 1e-9)))
    start = (rank * count) % len(cores)
    return frozenset(cores[(start + i) % len(cores)] for i in range(count))


class RlimitPlacement:
    """Limits carried by rlimits and affinity alone: nothing to clean up.

    ``oom_killed()`` is always False: without a memory cgroup the kernel keeps no count of OOM
    kills per worker, and an exit by SIGKILL could have any sender. (Under ``RLIMIT_AS`` an
    allocation fails instead, which Python reports as ``MemoryError``: the worker exits itself.)
    """

    def __init__(self, setup: ChildSetup) -> None:
        self.setup = setup

    @property
    def cgroups(self) -> tuple[Path, ...]:
        return ()

    def preexec(self) -> None:
        self.setup.apply()

    def oom_killed(self) -> bool:
        return False

    def close(self) -> None:
        return None


class RlimitBackend:
    """No cgroups: ``RLIMIT_NOFILE``, ``RLIMIT_AS`` for memory, and pinned cores for CPUs.

    ``RLIMIT_AS`` limits each process's address space, not the tree's resident memory: it is a
    crude stand-in (CUDA reserves far more address space than it uses, so GPU workers need a
    generous value or none).
    """

    name = "rlimit"

    def place(self, job_id: str, rank: int, limits: ResourceLimits) -> Placement:
        check_name("job_id", job_id)
        cores = None if limits.cpus is None else pick_cores(limits.cpus, rank)
        return RlimitPlacement(
            ChildSetup(nofile=limits.nofile, address_space=limits.memory_bytes, cores=cores)
        )

    def sweep(self, alive_job_ids: Collection[str]) -> tuple[Path, ...]:
        return ()

    def release(self) -> None:
        return None
