"""A local worker group: one process tree per local rank, supervised and stopped as a unit.

Each worker is a session leader (its own process group), carries a parent-death signal, writes
stdout and stderr to its append-only per-attempt log, and is tracked by the reaper sidecar and,
where the daemon may create one, by the job's tracking cgroup (``tracking``), which nothing it
forks can leave. Exits are noticed through a pidfd on the event loop, with no polling and no
watcher threads.

The group never opens a path under the log directory: ``jobs.logdir`` hands it an open log fd,
because opening by path as root would follow whatever the job (running as the user) planted there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from elasticd import log
from elasticd.workers import numa_memory
from elasticd.workers.cgroups.limits import Placement
from elasticd.workers.cgroups.tracking import JobTracking, NoJobTracking
from elasticd.workers.proctree import tree as proctree
from elasticd.workers.proctree.helper import exit_future
from elasticd.workers.proctree.markers import JOB_ENV, OWNER_ENV
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.proctree.spawn import Identity, worker_preexec
from elasticd.workers.zygote_program.shared import SPAWN_FAILED

_log = log.get("elasticd.workers")

__all__ = ["ColdSpawner", "Launch", "Spawner", "Worker", "WorkerGroup", "wall_clock"]

_EPOCH = time.time() - time.monotonic()


def wall_clock() -> float:
    """Seconds since the epoch, read off the monotonic clock: comparable with the timestamps
    workers write (``time.time()``), yet never going back when the wall clock is stepped, so
    exits seen one after the other are stamped in that order."""
    return _EPOCH + time.monotonic()


@dataclass(frozen=True)
class Launch:
    """One worker to start. ``log_fd`` belongs to the group from then on: ``WorkerGroup.start``
    closes it once the worker has it (the number is stale afterwards; never use it again)."""

    local_rank: int
    rank: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str  # entered by the worker as the user, never by root
    log_fd: int  # stdout and stderr, open for appending (see elasticd.jobs.logdir)
    log_path: Path  # where log_fd points: a name for reports, read back via jobs.logdir only
    error_file: Path  # TORCHELASTIC_ERROR_FILE, pre-created for the worker; same rule as log_path
    identity: Identity | None = None  # switch to the submitter (a root daemon); None: stay as we are
    limits: Placement | None = None  # cgroups and rlimits, joined in the child as root before the switch
    progress_fd: int | None = (
        None  # inherited by the worker (elasticd.progress.channel); the caller closes it
    )
    cpus: frozenset[int] | None = None  # bound to these CPUs before it runs (--numa-binding)
    mems: frozenset[int] | None = None  # NUMA nodes its memory prefers (those of ``cpus``)


class Worker:
    def __init__(self, launch: Launch, pid: int | None, exited: asyncio.Future[int]) -> None:
        self.launch = launch
        self.pid = pid
        self.exited = exited
        self.started_at = wall_clock()
        self._exited_at: float | None = None
        if exited.done():  # it never started
            self._exited_at = self.started_at
        else:
            exited.add_done_callback(self._seen)

    def _seen(self, _: object = None) -> None:
        if self._exited_at is None:
            self._exited_at = wall_clock()

    @property
    def running(self) -> bool:
        return not self.exited.done()

    @property
    def exited_at(self) -> float | None:
        """When its exit was seen (``wall_clock``), None while it runs. Stamped by the exit's
        callback, or by the first look at an exit whose callback has not run yet."""
        if self._exited_at is None and self.exited.done():
            self._seen()
        return self._exited_at


def before_drop(
    procs_fd: int | None,
    limits: Placement | None,
    cpus: frozenset[int] | None = None,
    mems: frozenset[int] | None = None,
) -> Callable[[], None] | None:
    """The child's root-only step: join the tracking cgroup (first, so nothing escapes it), then
    the limits, then the CPUs it is bound to (after the limits: they are the final word, within
    any pinned cores), then its memory policy (the thread's own: it survives exec; a refusal is
    the daemon's to log, ``numa_memory``). Only writes to fds the parent opened: no path is
    resolved after the fork."""
    if procs_fd is None and cpus is None and mems is None:
        return limits.preexec if limits is not None else None
    prefer = numa_memory.checked(mems) if mems else None

    def join() -> None:
        if procs_fd is not None:
            os.write(procs_fd, b"0")
        if limits is not None:
            limits.preexec()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        if prefer is not None:
            prefer()

    return join


class Spawner(Protocol):
    """How a group's workers come to be: exec'd afresh (``ColdSpawner``) or forked from the job's
    warm zygote (``elasticd.workers.warm.spawner.WarmSpawner``). Both give a session leader with the
    launch's identity, cwd, env, log and fds, in its tracking cgroup, with a parent-death signal."""

    @property
    def mode(self) -> str:
        """ "cold" or "warm", for logs."""
        ...

    async def spawn(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        """Start one worker (on the event-loop thread): its pid and exit future (a returncode as
        Popen's). Raises ``OSError`` or ``subprocess.SubprocessError`` when it did not start."""
        ...

    def spared(self) -> frozenset[int]:
        """Pids a group's clean-up must leave alone though they carry one of its markers (the zygote)."""
        ...

    def markers(self) -> frozenset[str]:
        """``ELASTICD_JOB`` values besides the job id that its workers' ``/proc/<pid>/environ``
        carries (a zygote's own: a forked worker keeps its parent's), for the sweeps and the fence."""
        ...


class ColdSpawner:
    """``python -u SCRIPT`` (or the executable) exec'd for every worker, as torchrun does."""

    mode = "cold"

    async def spawn(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        proc = subprocess.Popen(
            list(launch.argv),
            stdin=subprocess.DEVNULL,
            stdout=launch.log_fd,
            stderr=subprocess.STDOUT,
            env=launch.env,
            start_new_session=True,
            preexec_fn=worker_preexec(
                launch.cwd, launch.identity, before_drop(procs_fd, launch.limits, launch.cpus, launch.mems)
            ),
            close_fds=True,
            pass_fds=() if launch.progress_fd is None else (launch.progress_fd,),
        )
        return proc.pid, exit_future(proc)

    def spared(self) -> frozenset[int]:
        return frozenset()

    def markers(self) -> frozenset[str]:
        return frozenset()


class WorkerGroup:
    def __init__(
        self,
        launches: list[Launch],
        reaper: Reaper,
        grace_s: float,
        fence: bool = False,
        tracking: JobTracking | None = None,
        spawner: Spawner | None = None,
    ) -> None:
        """``fence``: the reaper kills this group when the node's lease deadline passes (multi-node
        jobs, whose peers go on without us once our lease is gone). ``tracking``: the job's
        tracking cgroup on this node (``Tracker.job``, or its ranks alone when a zygote lives
        beside them); None: the fallback alone. ``spawner``: cold unless given."""
        self.launches = launches
        self.workers: list[Worker] = []
        self._reaper = reaper
        self._grace_s = grace_s
        self._fence = fence
        self._tracking: JobTracking = tracking if tracking is not None else NoJobTracking()
        self._spawner: Spawner = spawner if spawner is not None else ColdSpawner()

    @property
    def _job(self) -> str | None:
        return self.launches[0].env.get(JOB_ENV) if self.launches else None

    async def start(self) -> None:
        """Spawn every worker, once. Must run on the event-loop thread (see ``spawn``). Closes
        every launch's log fd, also when a spawn raises, so none leaks into later children."""
        began = time.monotonic()
        try:
            for launch in self.launches:
                self.workers.append(await self._spawn(launch))
        finally:
            for launch in self.launches:
                with contextlib.suppress(OSError):
                    os.close(launch.log_fd)
        spawn_s = round(time.monotonic() - began, 4)
        _log.info(
            "group.spawned",
            job=self._job,
            mode=self._spawner.mode,
            workers=len(self.workers),
            spawn_s=spawn_s,
        )

    def _join_fd(self, launch: Launch) -> int | None:
        """The tracking leaf's ``cgroup.procs`` for this worker; on failure it runs untracked (the
        fallback still finds its tree) rather than not at all."""
        try:
            return self._tracking.join(launch.rank, launch.limits.cgroups if launch.limits else ())
        except OSError as exc:
            _log.error("tracking.join_failed", rank=launch.rank, error=str(exc))
            return None

    async def _spawn(self, launch: Launch) -> Worker:
        procs_fd = self._join_fd(launch)
        try:
            pid, exited = await self._spawner.spawn(launch, procs_fd)
        except (OSError, subprocess.SubprocessError) as exc:
            with contextlib.suppress(OSError):
                os.write(
                    launch.log_fd, f"elasticd: cannot start worker {list(launch.argv)[:3]}: {exc}\n".encode()
                )
            _log.warning("worker.spawn_failed", rank=launch.rank, error=str(exc))
            failed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            failed.set_result(SPAWN_FAILED)
            return Worker(launch, None, failed)
        finally:
            if procs_fd is not None:
                os.close(procs_fd)
        job = launch.env.get(JOB_ENV)
        self._reaper.track(pid, job if self._fence else None, sorted(self._spawner.markers()))
        _log.debug("worker.started", rank=launch.rank, pid=pid, mode=self._spawner.mode)
        rank = launch.rank
        exited.add_done_callback(
            lambda f: _log.info("worker.exited", rank=rank, pid=pid, returncode=f.result())
        )
        return Worker(launch, pid, exited)

    @property
    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.running]

    async def next_exit(self) -> Worker:
        """Wait for the next running worker to exit (the caller reads ``worker.exited``)."""
        pending = {w.exited: w for w in self.running}
        if not pending:
            raise RuntimeError("no running workers")
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        return pending[next(iter(done))]

    def exited_unseen(self, seen: set[int]) -> list[Worker]:
        return [w for w in self.workers if not w.running and w.launch.rank not in seen]

    async def _sweep_escapees(self) -> list[int]:
        """Kill what left the worker's session but kept its environment (double forks, daemons)."""
        if not self.launches:
            return []
        env = self.launches[0].env
        owner, job = env.get(OWNER_ENV), env.get(JOB_ENV)
        if owner is None or job is None:
            return []
        spared = self._spawner.spared()
        found = await asyncio.to_thread(proctree.marked, owner, job, *self._spawner.markers())
        leftovers = [p for p in found if p.pid not in spared]
        return await proctree.terminate(leftovers, [], 0.0) if leftovers else []

    async def stop(self, grace_s: float | None = None) -> list[int]:
        """Stop every process of every worker tree; returns pids that could not be killed."""
        grace = self._grace_s if grace_s is None else grace_s
        began = time.monotonic()
        pgids = [w.pid for w in self.workers if w.pid is not None]
        tree = [p for w in self.running if w.pid is not None for p in proctree.tree_of(w.pid)]
        # Orphans of workers that already exited keep their process group; find them there.
        for w in self.workers:
            if w.pid is not None and not w.running:
                tree.extend(proctree.group_members(w.pid))
        own = asyncio.gather(*(w.exited for w in self.workers))
        stuck = await proctree.terminate(tree, pgids, grace, extra_wait=own)
        # What is left in the job's cgroup escaped every other way (new session, no marker).
        stuck += [pid for pid in await asyncio.to_thread(self._tracking.kill) if pid not in stuck]
        stuck += await self._sweep_escapees()
        for pgid in pgids:
            self._reaper.untrack(pgid)
        with contextlib.suppress(Exception):
            await own
        for launch in self.launches:  # the trees are gone: their cgroups can go too
            if launch.limits is not None:
                launch.limits.close()
        await asyncio.to_thread(self._tracking.close)  # after the limits: a v2 leaf is shared
        stop_s = round(time.monotonic() - began, 4)
        _log.info("group.stopped", job=self._job, mode=self._spawner.mode, stop_s=stop_s, grace_s=grace)
        return stuck
