"""This node's pool of parked zygotes: the executor of ``pool_decider``, one per daemon.

A job's first start costs its zygote's ``import torch``; the next job whose launch would start an
identical zygote (``ZygoteKey``) can skip it if the previous one's zygote was kept. Every job's
``ProcessLauncher`` offers its healthy zygote here when it leaves the node (``offer``) and asks for
one when it is admitted (``take``).

Where a parked zygote lives: it was in its job's tracking cgroup (leaf ``zygote``), which goes when
the job ends here, so parking moves it (by pid, written by the daemon; it is our child, pinned by a
pidfd) to the node's pool leaf ``<base>/_zygotes``, and adoption moves it into the adopting job's
leaf. The pool leaf is below the daemon's base like every job's, so the reaper's kill of the base
(the daemon died) and a restarted daemon's sweep take parked zygotes too; they also carry the node's
marker and a parent-death signal, as every worker does. ``close`` (daemon stop) stops them all.

What is checked before a job adopts one: the key, exactly (so never across users); that it is
still alive and READY; and, by the zygote itself as the user (the daemon never opens user files),
that no file behind its loaded modules or its interpreter changed since it was ready: a worker
forked from it would run that code, a fresh process the new. A stale one is stopped and the job
starts a fresh zygote.

Log events: ``zygote.parked`` (rss), ``zygote.adopted`` (``from_job``, ``parked_s``), ``zygote.stale``
(``changed``), ``zygote.dropped`` (``why``: expired, evicted, low_memory, lost, closed),
``zygote.not_parked`` (``why``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import psutil

from elasticd import log
from elasticd.workers.cgroups.tracking import JobTracking, NoTracker, Tracker
from elasticd.workers.warm import pool_decider as pd
from elasticd.workers.warm.spawn import ZygoteError, ZygoteKey, ZygoteSetup
from elasticd.workers.warm.zygote import Zygote

_log = log.get("elasticd.zygote")

MIN_AVAILABLE = 0.10  # memory is low below this share of RAM available: nothing is parked


def memory_low() -> bool:
    """Whether less than ``MIN_AVAILABLE`` of the node's memory is available (``/proc/meminfo``)."""
    try:
        vm = psutil.virtual_memory()
    except (OSError, RuntimeError):
        return False
    return vm.available < vm.total * MIN_AVAILABLE


@dataclass(frozen=True)
class _Parked:
    zygote: Zygote
    job: str  # the job it served last
    parked_at: float


class ZygotePool:
    """The parked zygotes of this node. Methods run on the event-loop thread."""

    def __init__(
        self,
        limits: pd.Limits,
        tracker: Tracker | None = None,
        clock: Callable[[], float] = time.monotonic,
        low_memory: Callable[[], bool] = memory_low,
    ) -> None:
        self.limits = limits
        self._tracker: Tracker = tracker if tracker is not None else NoTracker()
        self._clock = clock
        self._low_memory = low_memory
        self._pool = pd.Pool()
        self._parked: dict[int, _Parked] = {}
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._stopping: set[asyncio.Future[None]] = set()
        self._closed = False

    @classmethod
    def disabled(cls) -> ZygotePool:
        return cls(pd.Limits(size=0))

    def __len__(self) -> int:
        return len(self._pool.entries)

    def key_of(self, setup: ZygoteSetup) -> ZygoteKey:
        return setup.key(tracked=self._tracker.base is not None)

    # -- a job leaves: its zygote is offered -----------------------------------------------------
    def offer(self, zygote: Zygote) -> bool:
        """Park ``zygote`` (its job left this node; its workers are stopped), or say no (False: the
        caller stops it). On True the pool owns it."""
        why = self._unfit(zygote)
        if why is not None:
            _log.info("zygote.not_parked", job=zygote.job, pid=zygote.pid, why=why)
            return False
        entry = next(self._ids)
        now = self._clock()
        actions = self._apply(
            pd.park(self._pool, entry, self.key_of(zygote.setup), self.limits, now, self._low_memory())
        )
        refused = next((a for a in actions if isinstance(a, pd.Stop) and a.id == entry), None)
        if refused is not None:
            _log.info("zygote.not_parked", job=zygote.job, pid=zygote.pid, why=refused.why.value)
            return False
        if not self._move(zygote, None):
            self._apply(pd.lost(self._pool, entry))
            _log.warning("zygote.not_parked", job=zygote.job, pid=zygote.pid, why="cgroup")
            return False
        self._parked[entry] = _Parked(zygote, zygote.job, now)
        zygote.on_lost(lambda _: self._lost(entry))
        keep_s, rss = self.limits.keep_s, zygote.rss()
        _log.info("zygote.parked", job=zygote.job, pid=zygote.pid, rss=rss, keep_s=keep_s, parked=len(self))
        self._arm()
        return True

    def _unfit(self, zygote: Zygote) -> str | None:
        if self._closed:
            return "closed"
        if self.limits.off:
            return pd.Why.OFF.value
        if not zygote.idle:
            return f"not idle ({zygote.state.value})"
        return None

    # -- a job is admitted: is there one like the zygote it would start? --------------------------
    async def take(self, setup: ZygoteSetup, tracking: JobTracking) -> Zygote | None:
        """A parked zygote identical to the one ``setup`` would start, checked fresh and moved into
        the job's cgroup (``tracking``), serving ``setup.job_id``; None: start a fresh one."""
        if self._closed or self.limits.off:
            return None
        now = self._clock()
        actions = self._apply(pd.want(self._pool, self.key_of(setup), self.limits, now, self._low_memory()))
        check = next((a for a in actions if isinstance(a, pd.Check)), None)
        if check is None:
            return None
        parked = self._parked[check.id]
        zygote = parked.zygote
        try:
            answer = await zygote.check()
            fresh, changed, files = answer.fresh, answer.changed, answer.files
        except ZygoteError as exc:
            fresh, changed, files = False, f"({exc})", 0
        actions = self._apply(pd.checked(self._pool, check.id, fresh), keep=check.id)
        if any(isinstance(a, pd.Stop) for a in actions):
            _log.info("zygote.stale", job=setup.job_id, pid=zygote.pid, from_job=parked.job, changed=changed)
            self._stop_now(check.id, pd.Why.STALE)
        if not any(isinstance(a, pd.Adopt) for a in actions):
            return None
        self._parked.pop(check.id)
        zygote.on_lost(None)
        if not self._move(zygote, tracking):
            _log.warning("zygote.dropped", job=parked.job, pid=zygote.pid, why="cgroup")
            self._background(zygote.close())
            return None
        zygote.adopt(setup.job_id)
        _log.info(
            "zygote.adopted",
            job=setup.job_id,
            pid=zygote.pid,
            from_job=parked.job,
            parked_s=round(self._clock() - parked.parked_at, 3),
            files=files,
        )
        return zygote

    # -- the executor ------------------------------------------------------------------------------
    def _apply(self, decision: pd.Decision, keep: int | None = None) -> list[pd.Action]:
        """Take the decider's new pool, carry out its stops and forgets; return the other actions.
        A stop of ``keep`` is left to the caller (it logs why first)."""
        self._pool, actions = decision
        for action in actions:
            match action:
                case pd.Stop(entry, why) if entry != keep:
                    self._stop_now(entry, why)
                case pd.Forget(entry, why):
                    gone = self._parked.pop(entry, None)
                    if gone is not None:
                        _log.warning("zygote.dropped", job=gone.job, pid=gone.zygote.pid, why=why.value)
        self._arm()
        return actions

    def _stop_now(self, entry: int, why: pd.Why) -> None:
        parked = self._parked.pop(entry, None)
        if parked is None:  # the offered one, refused: its job's launcher stops it
            return
        parked.zygote.on_lost(None)
        parked_s = round(self._clock() - parked.parked_at, 3)
        _log.info("zygote.dropped", job=parked.job, pid=parked.zygote.pid, why=why.value, parked_s=parked_s)
        self._background(parked.zygote.close())

    def _lost(self, entry: int) -> None:
        self._apply(pd.lost(self._pool, entry))

    def _background(self, stop: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(stop)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _move(self, zygote: Zygote, tracking: JobTracking | None) -> bool:
        """Into the pool's leaf (``tracking`` None) or the adopting job's; True when it is there
        (or there is no tracking cgroup)."""
        try:
            fd = self._tracker.pool_procs() if tracking is None else tracking.join_zygote()
        except OSError as exc:
            _log.error("tracking.join_failed", job=zygote.job, rank="zygote", error=str(exc))
            return False
        if fd is None:
            return True
        try:
            return zygote.move_to(fd)
        finally:
            os.close(fd)

    def _arm(self) -> None:
        """Wake up when the next entry expires."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = pd.next_expiry(self._pool, self.limits)
        if when is None or self._closed:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, when - self._clock()) + 0.001, self.expire)

    def expire(self) -> None:
        """Stop the entries kept ``keep_s`` (the timer calls it)."""
        self._timer = None
        self._apply(pd.expire(self._pool, self.limits, self._clock()))

    async def close(self) -> None:
        """The daemon stops: stop every parked zygote, refuse new ones, remove the pool's cgroup."""
        self._closed = True
        self._apply(pd.close(self._pool))
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self._tracker.drop_pool)
