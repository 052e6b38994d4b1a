"""Find and kill whole process trees: TERM, wait to a deadline, KILL, tolerate the already-gone.

A worker's tree is found three ways, because each alone misses something:
- the worker and its psutil descendants (while the worker lives);
- its process group (the worker is a session leader, so orphaned grandchildren keep the pgid;
  a warm worker becomes one only after its fork, so the worker is also signalled itself);
- an environment marker (``ELASTICD_OWNER``/``ELASTICD_JOB``) inherited by anything that escaped
  into a new session but kept its environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import psutil

from elasticd import log
from elasticd.workers.proctree.markers import JOB_ENV, OWNER_ENV

_log = log.get("elasticd.proctree")


def tree_of(pid: int) -> list[psutil.Process]:
    """The process and its descendants. A stop signals these as well as the process group: a
    warm worker leads its own group only once it has called ``setsid`` after its fork, and a
    ``killpg`` before that finds no group of its pid (a SIGTERM lost so would let it train on
    through the whole grace, to a SIGKILL)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def marked(owner: str, *jobs: str) -> list[psutil.Process]:
    """Processes whose environment says they belong to this node (and to one of ``jobs``: a job
    id or a zygote's marker, when given)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get(OWNER_ENV) == owner and (not jobs or env.get(JOB_ENV) in jobs):
            found.append(proc)
    return found


def _signal_all(procs: Iterable[psutil.Process], pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


async def terminate(
    procs: list[psutil.Process],
    pgids: list[int],
    grace_s: float,
    *,
    extra_wait: asyncio.Future[Any] | None = None,
) -> list[int]:
    """SIGTERM everything, wait up to ``grace_s``, SIGKILL what is left; returns unkillable pids.

    ``extra_wait`` lets the caller also wait for its own direct children, which it reaps itself
    (psutil must not reap them, or their exit codes would be lost).
    """
    _signal_all(procs, pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(procs) and (extra_wait is None or extra_wait.done()):
            break
        await asyncio.sleep(0.02)
    survivors = _alive(procs)
    if survivors or (extra_wait is not None and not extra_wait.done()):
        _log.warning("proctree.escalate", pids=[p.pid for p in survivors], grace_s=grace_s)
        _signal_all(survivors, pgids, signal.SIGKILL)
    if extra_wait is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(extra_wait), timeout=5.0)
    deadline = time.monotonic() + 5.0
    while _alive(survivors) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stuck = [p.pid for p in _alive(survivors)]
    if stuck:
        _log.error("proctree.unkillable", pids=stuck)
    return stuck
