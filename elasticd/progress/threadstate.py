"""The I/O side of ``slowness``: a thread that looks at each local rank's main thread in ``/proc``
every ``SAMPLE_S`` and keeps what it saw in one ``ActivityWindow`` per rank, with the time the
thread waited for a CPU (its ``schedstat``, read once a second); the node's ranks of the job pool
that wait (``slowness.pool``) before their evidence is published.

Nothing runs in the workers and nothing in the script changes: the daemon reads the kernel's
view of the thread (its state letter, and for a sleeping thread the kernel function it sleeps in).
``/proc`` is the kernel's, not a directory a user can write, and the daemon reads it as root as it
reads CPU times (``sampler``); a worker's process can only change what its own rank is seen doing.
A pid that ends between two looks is skipped (its rank stops being sampled once it is gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from elasticd import log
from elasticd.progress.slowness import SAMPLE_S, ActivityWindow, Evidence, aligned_end, classify, pool

_log = log.get("elasticd.progress")


def look(pid: int) -> tuple[str, str] | None:
    """The state letter of ``pid``'s main thread and, when it sleeps, the kernel function it sleeps
    in; None when the process is gone."""
    base = f"/proc/{pid}/task/{pid}/"
    try:
        with open(base + "stat", "rb") as f:
            stat = f.read(4096)
        state = stat[stat.rindex(b")") + 2 :][:1].decode("ascii", "replace")
        if state not in ("S", "I"):
            return state, ""
        with open(base + "wchan", "rb") as f:
            return state, f.read(128).decode("ascii", "replace")
    except (OSError, ValueError):
        return None


def cpu_times(pid: int) -> tuple[float, float] | None:
    """Seconds ``pid``'s main thread has run, and spent runnable but waiting for a CPU (including
    a cgroup's throttling), since it started; None when it is gone or the kernel does not say."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
            run, delay = f.read(256).split()[:2]
        return int(run) / 1e9, int(delay) / 1e9
    except (OSError, ValueError):
        return None


class ActivitySampler:
    """Samples the main thread of each rank in ``ranks`` (``(rank, pid)``) until ``close``.

    ``clock`` is the daemon's wall clock, so evidence lines up with the progress it is published
    beside; ``look_at`` and ``cpu_of`` are seams for tests."""

    def __init__(
        self,
        ranks: Sequence[tuple[int, int]],
        clock: Callable[[], float] = time.time,
        look_at: Callable[[int], tuple[str, str] | None] = look,
        period_s: float = SAMPLE_S,
        cpu_of: Callable[[int], tuple[float, float] | None] = cpu_times,
    ) -> None:
        self._ranks = list(ranks)
        self._clock = clock
        self._look = look_at
        self._period = period_s
        self._windows = {rank: ActivityWindow() for rank, _ in self._ranks}
        self._cpu_of = cpu_of
        self._cpu: dict[int, tuple[int, float, float]] = {}  # rank -> (second read, run, delay then)
        self._gone: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-activity", daemon=True)

    def start(self) -> None:
        if self._ranks:
            self._thread.start()

    def close(self) -> None:
        """Stop sampling (the thread ends within one period; nothing waits for it)."""
        self._stop.set()

    def evidence(self, rank: int) -> Evidence | None:
        """``rank``'s evidence over the window now; None while too little was seen (or never)."""
        window = self._windows.get(rank)
        if window is None:
            return None
        with self._lock:
            return window.evidence(self._clock())

    def evidence_all(self) -> tuple[float, dict[int, Evidence]]:
        """The end of the last whole window (``slowness.aligned_end``: the same on every node) and
        every sampled rank's evidence over it, their waits for a CPU pooled (``slowness.pool``):
        the ranks of this node share its CPUs."""
        with self._lock:
            until = aligned_end(self._clock())
            seen = {rank: e for rank, w in self._windows.items() if (e := w.evidence(until)) is not None}
        return until, pool(seen)

    def sample_once(self) -> None:
        """One look at every rank still running."""
        for rank, pid in self._ranks:
            if rank in self._gone:
                continue
            seen = self._look(pid)
            if seen is None:
                self._gone.add(rank)
                continue
            activity = classify(*seen)
            if activity is not None:
                with self._lock:
                    self._windows[rank].add(activity, self._clock())
            self._queued(rank, pid)

    def _queued(self, rank: int, pid: int) -> None:
        """Once a second, the CPU time ``rank`` ran and waited for since the last read."""
        now = self._clock()
        last = self._cpu.get(rank)
        if last is not None and last[0] == int(now):
            return
        seen = self._cpu_of(pid)
        if seen is None:
            return
        self._cpu[rank] = (int(now), *seen)
        if last is not None:
            with self._lock:
                self._windows[rank].cpu(seen[0] - last[1], seen[1] - last[2], now)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._period):
                self.sample_once()
                if len(self._gone) == len(self._ranks):
                    return
        except Exception:  # a sampler that dies costs the scores, never the job
            _log.exception("activity_sampler.crashed")
