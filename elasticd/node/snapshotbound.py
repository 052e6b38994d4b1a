"""The bound on one job's memory snapshots on this node, when the operator set none. Pure: the
host's memory comes in as numbers (``node/hostmemory.py`` reads them, once, at start).

Snapshots are on unless turned off, so that a first job loses at most a step after a crash. The
bound is a ceiling, not a reservation: a keeper allocates only what its ranks snapshot, and a
snapshot over the bound falls back to disk for that rank. It is derived as:

- **Half of the smallest of RAM, ``/dev/shm``'s size and its free space.** Linux sizes a tmpfs at
  half of RAM by default, so on a plain host this is a quarter of RAM: a job's snapshots (two per
  rank, and the replica of its peer's) then leave most of the memory to its workers and the page
  cache. ``/dev/shm`` bounds it because the keeper falls back to files there where
  ``memfd_create`` is refused (a write past a tmpfs's size is a SIGBUS), and the node refuses at
  submit a bound that ``/dev/shm`` could not hold (``jobs/snapshotspace.py``); its free space,
  because what data loaders and NCCL already keep there is not ours to take. The other half is
  left to them.
- **A floor** (``FLOOR``): a host whose half comes under it (Docker's default ``/dev/shm`` is
  64 MB) gets no snapshots (0): such a bound holds only toy states, and the little ``/dev/shm``
  there is belongs to the job's data loaders.
- **A cap** (``CAP``): each of a node's jobs has its own bound, so on a very large host a share
  times its jobs could still reach most of its memory; past the cap, how much a job's snapshots
  may take is the operator's decision (``snapshot_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

FLOOR = 256 << 20  # under it, no snapshots
CAP = 256 << 30  # a derived bound never goes past it
SHARE = 2  # the bound is 1/SHARE of the smallest of RAM, /dev/shm's size and its free space


class BoundSource(StrEnum):
    """Where a node's snapshot bound came from, as ``elasticctl nodes`` shows it."""

    DERIVED = "derived"  # from the host's memory (``derive``): snapshot_bytes left unset
    SET = "set"  # the operator's snapshot_bytes, used as is (0: off)


@dataclass(frozen=True)
class HostMemory:
    """What the host has, in bytes; None where it could not be read."""

    mem_total: int | None  # /proc/meminfo's MemTotal
    shm_size: int | None  # /dev/shm's size (statvfs: f_blocks * f_frsize); None: no /dev/shm
    shm_free: int | None  # what an unprivileged user may still write there (f_bavail * f_frsize)


@dataclass(frozen=True)
class SnapshotBound:
    """The bytes one job's snapshots may hold on this node (0: no keeper), and where that came from."""

    bytes: int
    source: BoundSource


def derive(host: HostMemory) -> int:
    """The bound a node derives from its memory: 0 when it cannot tell, or has too little."""
    known = (host.mem_total, host.shm_size, host.shm_free)
    if any(v is None or v <= 0 for v in known):
        return 0
    share = min(v for v in known if v is not None) // SHARE
    return 0 if share < FLOOR else min(share, CAP)


def bound_of(setting: int | None, host: HostMemory) -> SnapshotBound:
    """The operator's ``snapshot_bytes`` as is (0 turns snapshots off), else the derived bound."""
    if setting is not None:
        return SnapshotBound(setting, BoundSource.SET)
    return SnapshotBound(derive(host), BoundSource.DERIVED)


def parse_meminfo(text: str) -> int | None:
    """MemTotal in bytes from ``/proc/meminfo``'s text (None: absent or malformed)."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name != "MemTotal":
            continue
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit() and len(parts[0]) <= 15:
            return int(parts[0]) * 1024
        return None
    return None
