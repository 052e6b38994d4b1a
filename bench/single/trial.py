"""One trial of bench_single, and what the workers' stamps say about it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.paths import REPO

WORKER = REPO / "bench" / "worker.py"
NPROC = 2
MAX_RESTARTS = 3
DAEMON_STOP_GRACE_S = 5  # the daemon's --stop-grace (SIGTERM -> SIGKILL for workers)
DAEMON_SHUTDOWN_S = 20  # SIGTERM to the daemon, then SIGKILL after this long

_ATTEMPT_FILE = re.compile(r"^first_collective\.a(\d+)\.r(\d+)$")


def read_stamp(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def attempts(out: Path) -> dict[int, dict[int, float]]:
    """attempt -> rank -> first-collective time, from the stamps the workers wrote."""
    found: dict[int, dict[int, float]] = {}
    for p in out.iterdir():
        m = _ATTEMPT_FILE.match(p.name)
        if m and (t := read_stamp(p)) is not None:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = t
    return found


def complete(per_rank: dict[int, float] | None) -> float | None:
    """Max over ranks if every rank of the world reported, else None."""
    if not per_rank or sorted(per_rank) != list(range(NPROC)):
        return None
    return max(per_rank.values())


@dataclass
class Trial:
    scenario: str
    launcher: str
    index: int  # 1-based trial number within the scenario (0: warm-up)
    ok: bool = False  # the launcher reported success (elasticd SUCCEEDED / torchrun exit 0)
    value_s: float | None = None  # start: launch -> last rank's first collective; restart: a1
    recovery_s: float | None = None  # restart: crash -> first complete attempt >= 1
    recovered_attempt: int | None = None
    restarts: int | None = None
    timed_out: bool = False
    launcher_rc: int | None = None
    wall_s: float | None = None  # launch -> launcher exit
    state: str | None = None  # elasticd job state
    job: str | None = None  # elasticd job id
    zygote: str | None = None  # elasticd: "adopted" (a parked one), "started" (its own), "none"
    attempts_seen: list[int] = field(default_factory=list)
    leftovers_killed: list[str] = field(default_factory=list)
    error: str = ""

    def note(self, message: str) -> None:
        self.error = f"{self.error}; {message}" if self.error else message

    @property
    def flaky(self) -> bool:
        """Restart scenario: the trial failed, or needed more than one restart."""
        return (not self.ok) or self.restarts is None or self.restarts > 1
