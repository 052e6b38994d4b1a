"""How full etcd is, as a level, and what follows from it: pure (no I/O, no clock).

etcd refuses every write that would grow its database once the database file reaches its quota
(``--quota-backend-bytes``), and raises the NOSPACE alarm, which stays until an operator disarms
it: from then on no node can write a round, a status or a join, and no lease can be granted.
So the daemon stops taking new work well before: above ``etcd_high_water`` of the quota, new
submits are refused (``etcd_full``), while running jobs keep running and writing; and the
janitor removes ended jobs' records, oldest first, to make room (``relief``).

The size compared with the mark is the database file's (``db_size``): it is what etcd's quota
counts. Removing records and compacting lowers ``db_size_in_use``; only a defragmentation (an
operator's decision: it blocks the member while it runs) gives the file back. The level leaves
HIGH only below the mark less ``HYSTERESIS`` of the quota, so that it does not flap at the mark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from elasticd.etcd.types import EtcdStatus

HYSTERESIS = 0.05  # of the quota: HIGH is left below (high_water - HYSTERESIS) * quota
MIB = 1024 * 1024


class SpaceLevel(StrEnum):
    """How full etcd is.

    Transitions: UNKNOWN -> any (the first read); OK -> HIGH (db_size above the mark);
    HIGH -> OK (below the mark less the hysteresis); any -> FULL (an alarm is raised);
    FULL -> HIGH or OK (the alarm disarmed: by size, as from UNKNOWN); any -> UNKNOWN (etcd did
    not say: unreachable, or the status is reserved to its admins)."""

    UNKNOWN = "unknown"
    OK = "ok"
    HIGH = "high"
    FULL = "full"


@dataclass(frozen=True)
class SpaceLimits:
    """The settings ``etcd_quota_bytes`` and ``etcd_high_water``."""

    quota_bytes: int
    high_water: float

    @property
    def mark(self) -> int:
        return int(self.quota_bytes * self.high_water)

    @property
    def low_mark(self) -> int:
        return int(self.quota_bytes * max(0.0, self.high_water - HYSTERESIS))


def decide(status: EtcdStatus | None, limits: SpaceLimits, previous: SpaceLevel) -> SpaceLevel:
    """The level after reading ``status`` (None: etcd did not say), coming from ``previous``."""
    if status is None:
        return SpaceLevel.UNKNOWN
    if status.alarms:
        return SpaceLevel.FULL
    if status.db_size > limits.mark:
        return SpaceLevel.HIGH
    if previous is SpaceLevel.HIGH and status.db_size > limits.low_mark:
        return SpaceLevel.HIGH
    return SpaceLevel.OK


@dataclass(frozen=True)
class Space:
    """The last reading: its level, what etcd said, and the settings it was judged by."""

    level: SpaceLevel
    status: EtcdStatus | None
    limits: SpaceLimits
    read_at: float = 0.0  # seconds since the epoch (0: never read)

    @property
    def refuses_submits(self) -> bool:
        return self.level in (SpaceLevel.HIGH, SpaceLevel.FULL)

    def message(self) -> str:
        """Why new submits are refused, and what an operator does about it."""
        s, q = self.status, self.limits
        size = f"{_mib(s.db_size)} ({_mib(s.db_size_in_use)} in use)" if s is not None else "unknown"
        quota = f"{_mib(q.quota_bytes)} (etcd_quota_bytes={q.quota_bytes})"
        if s is not None and "CORRUPT" in s.alarms:
            return (
                f"new jobs are refused: etcd has raised the CORRUPT alarm (database {size}, quota "
                f"{quota}): it refuses writes; an operator restores the corrupt member from a "
                "snapshot (etcd's disaster recovery guide), then runs `etcdctl alarm disarm`"
            )
        if s is not None and s.alarms:
            why = f"etcd has raised the {', '.join(s.alarms)} alarm: its database, {size}, is at its quota"
        else:
            why = (
                f"etcd's database is {size}, above the high-water mark {_mib(q.mark)} "
                f"(etcd_high_water={q.high_water:g}) of its quota"
            )
        return (
            f"new jobs are refused: {why} {quota}; running jobs go on. An operator makes room: "
            "`elasticctl rm` ended jobs (the janitor already removes the oldest), `etcdctl compact "
            "<revision>`, `etcdctl defrag` on each member in turn, then `etcdctl alarm disarm` if "
            "an alarm is raised"
        )

    def to_json(self) -> dict[str, Any]:
        s = self.status
        return {
            "level": self.level.value,
            "db_size": s.db_size if s is not None else None,
            "db_size_in_use": s.db_size_in_use if s is not None else None,
            "quota_bytes": self.limits.quota_bytes,
            "high_water_bytes": self.limits.mark,
            "alarms": list(s.alarms) if s is not None else [],
            "read_at": self.read_at,
        }


@dataclass(frozen=True)
class Ended:
    """An ended job as the janitor's relief sees it: when it ended and what its records weigh."""

    job: str
    ended_at: float
    size: int  # bytes of its keys and values


def excess(space: Space) -> int:
    """Bytes in use above the low mark, which removing records (then compacting) can give back."""
    if not space.refuses_submits or space.status is None:
        return 0
    in_use = space.status.db_size_in_use or space.status.db_size
    return max(0, in_use - space.limits.low_mark)


def relief(space: Space, ended: Sequence[Ended]) -> list[str]:
    """The ended jobs to remove now, before their retention is up: the oldest first, until their
    records add up to what is in use above the low mark (none while the level is OK)."""
    need = excess(space)
    chosen: list[str] = []
    for job in sorted(ended, key=lambda e: (e.ended_at, e.job)):
        if need <= 0:
            break
        chosen.append(job.job)
        need -= job.size
    return chosen


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"
