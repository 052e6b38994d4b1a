"""Killing a cgroup tree and removing it: ``cgroup.kill`` (kernel 5.14+), ``cgroup.events``, rmdir.

The tracking cgroups' kernel mechanics (``tracking``); the reaper sidecar repeats them in a few
lines of its own (it imports nothing of the package's).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from elasticd import log
from elasticd.workers.cgroups.fs import CgroupFs, remove_cgroup

_log = log.get("elasticd.tracking")

KILL_WAIT_S = 5.0  # how long a kill waits for the kernel to report the cgroup empty


def populated(fs: CgroupFs, cgroup: Path) -> bool:
    """Whether any process is in ``cgroup`` or below (``cgroup.events``); a missing one is empty."""
    try:
        text = fs.read(cgroup / "cgroup.events")
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() != "0"
    return False


def kill_cgroup(
    fs: CgroupFs, cgroup: Path, wait_s: float = KILL_WAIT_S, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """SIGKILL every process in ``cgroup`` and below; True once none is left (or it never existed).

    ``wait_s`` bounds the wait for the kernel to finish (0: do not wait, e.g. the reaper's fence).
    """
    try:
        fs.write(cgroup / "cgroup.kill", "1")
    except FileNotFoundError:
        return True
    except OSError as exc:
        _log.error("tracking.kill_failed", cgroup=str(cgroup), error=str(exc))
        return False
    deadline = time.monotonic() + wait_s
    delay = 0.005
    while populated(fs, cgroup):
        if time.monotonic() >= deadline:
            return False
        sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def members(fs: CgroupFs, cgroup: Path) -> list[int]:
    """The pids in ``cgroup`` and below (for reports: they can be gone by the time they are read)."""
    pids: list[int] = []
    for procs in sorted(cgroup.rglob("cgroup.procs")) if cgroup.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            pids += [int(pid) for pid in fs.read(procs).split()]
    return pids


def remove_tree(fs: CgroupFs, cgroup: Path) -> bool:
    """rmdir ``cgroup`` and its children, deepest first; False if one stayed busy (a process left).

    A cgroup can stay busy for a moment after its last process died, hence the retries.
    """
    children = [p for p in cgroup.iterdir() if p.is_dir()] if cgroup.is_dir() else []
    emptied = all([remove_tree(fs, child) for child in children])
    return remove_cgroup(fs, cgroup, tries=5) and emptied
