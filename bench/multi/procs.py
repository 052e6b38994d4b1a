"""Finding and measuring the processes of a trial: a node's workers and reaper, a torchrun
agent's tree, and their CPU use."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import psutil

from elasticd.workers.proctree import tree as proctree


def alive(x: Any) -> bool:
    """A daemon or an agent (anything with a ``proc``) is still running."""
    return bool(x.proc is not None and x.proc.poll() is None)


def node_processes(node_id: str) -> list[psutil.Process]:
    """The node's workers (and anything they started), found by elasticd's own owner marker,
    plus its reaper sidecar (``python -m elasticd.workers.proctree.reaper <node>``)."""
    found = proctree.marked(node_id)
    for proc in psutil.process_iter():
        try:
            cmd = proc.cmdline()
        except (psutil.Error, OSError):
            continue
        if "elasticd.workers.proctree.reaper" in cmd and node_id in cmd:
            found.append(proc)
    return found


def lifetime_cpu(pid: int) -> float:
    """Mean CPU use of a live process since it started, in % of one core."""
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        age = time.time() - p.create_time()
    except psutil.Error:
        return float("nan")
    return round(100 * (t.user + t.system) / age, 1) if age > 0 else float("nan")


def tree_pgids(root_pid: int) -> tuple[list[psutil.Process], list[int]]:
    """Descendants of ``root_pid`` and every process group in that tree (torchrun puts each worker
    in a session of its own, so the agent's group alone does not hold them)."""
    try:
        procs = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        procs = []
    pgids = {root_pid}
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgids.add(os.getpgid(p.pid))
    return procs, sorted(pgids)


def runs_no_worker(agent: Any) -> bool:
    """The torchrun agent has no live child process (no worker)."""
    try:
        children = psutil.Process(agent.proc.pid).children()
    except psutil.Error:
        return True
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def torchrun_ranks(agents: dict[str, Any]) -> dict[str, str]:
    """rank -> agent name, from the workers' environments (children of each agent)."""
    ranks = {}
    for name, a in agents.items():
        procs, _ = tree_pgids(a.proc.pid)
        for p in procs:
            with contextlib.suppress(psutil.Error, OSError):
                env = p.environ()
                if "RANK" in env and "LOCAL_RANK" in env:
                    ranks[env["RANK"]] = name
    return ranks
