"""The reaper sidecar: it outlives a crashed or frozen daemon just long enough to kill its workers.

The daemon starts it with a pipe on stdin and tells it, one line at a time:
- ``track <pgid> [<job>]``: a worker's process group; with a job id the group is *fenced*;
- ``untrack <pgid>``;
- ``deadline <t>``: CLOCK_MONOTONIC time at which the node's etcd lease may have expired.

Two things make it act:
- The pipe closes: the daemon is gone. If it exited cleanly there is nothing left to kill; if it
  was killed, the reaper kills the daemon's tracking cgroup (``cgroup.kill`` on ``<base>``, every
  job at once) and removes what is left of it, then SIGKILLs every tracked process group and every
  process marked with this node's owner marker, grandchildren included. (Workers also carry a
  parent-death signal; the reaper covers what that cannot: their own children.)
- The deadline passes without a newer one: the daemon could not renew its lease in time (frozen,
  stuck, cut off from etcd). Its peers will go on without this node, so fenced groups (multi-node
  jobs) are killed *before* the lease can expire: two rounds of a job never run at once. A fenced
  job's tracking cgroup ``<base>/<job>`` is killed with them.

Run as ``python -m elasticd.workers.reaper OWNER [CGROUP_BASE]``; ``CGROUP_BASE`` is the
daemon's ``Tracker.base`` (absent where there is no tracking cgroup). It sits in its own session
and ignores SIGINT/SIGTERM/SIGHUP so that a Ctrl-C or a stop aimed at the daemon does not take it
first.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from elasticd.workers import proctree
from elasticd.workers.cgroups import KernelFs
from elasticd.workers.limits import LimitError
from elasticd.workers.spawn import child_env
from elasticd.workers.tracking import CgroupTracker, kill_cgroup


def _fence(owner: str, fenced: dict[int, str], tracker: CgroupTracker | None) -> None:
    jobs = set(fenced.values())
    for job in sorted(jobs):
        try:
            if tracker is not None:
                kill_cgroup(KernelFs(), tracker.job(job).path, wait_s=0)  # the kernel takes it from here
        except LimitError:  # not a job id: the daemon never sends one
            continue
    procs = [p for job in jobs for p in proctree.marked(owner, job)]
    proctree.kill_now(procs, sorted(fenced))
    fenced.clear()


def _daemon_gone(owner: str, tracked: set[int], tracker: CgroupTracker | None) -> None:
    if tracker is not None:
        tracker.sweep()  # kills every job at once, then removes their cgroups
        tracker.release()
    proctree.kill_now(proctree.marked(owner), sorted(tracked))


def main(argv: list[str]) -> int:
    owner = argv[1]
    tracker = CgroupTracker(Path(argv[2]), KernelFs()) if len(argv) > 2 else None
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    tracked: set[int] = set()
    fenced: dict[int, str] = {}
    deadline = 0.0
    buffer = b""
    stdin = sys.stdin.fileno()
    while True:
        wait = max(0.0, deadline - time.monotonic()) if deadline and fenced else None
        ready, _, _ = select.select([stdin], [], [], wait)
        if not ready:
            _fence(owner, fenced, tracker)
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            verb, *args = line.decode().split()
            if verb == "track" and args and args[0].isdigit():
                tracked.add(int(args[0]))
                if len(args) > 1:
                    fenced[int(args[0])] = args[1]
            elif verb == "untrack" and args and args[0].isdigit():
                tracked.discard(int(args[0]))
                fenced.pop(int(args[0]), None)
            elif verb == "deadline" and args:
                deadline = float(args[0])
    _daemon_gone(owner, tracked, tracker)
    return 0


class Reaper:
    """The daemon's handle on its sidecar."""

    def __init__(self, owner: str, cgroup_base: Path | None = None) -> None:
        self._owner = owner
        self._cgroup_base = cgroup_base
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "elasticd.workers.reaper",
                self._owner,
                *([str(self._cgroup_base)] if self._cgroup_base is not None else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=child_env(),
            close_fds=True,
        )

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def track(self, pgid: int, fence_job: str | None = None) -> None:
        self._send(f"track {pgid} {fence_job}" if fence_job else f"track {pgid}")

    def untrack(self, pgid: int) -> None:
        self._send(f"untrack {pgid}")

    def set_deadline(self, monotonic_deadline: float) -> None:
        self._send(f"deadline {monotonic_deadline:.3f}")

    def close(self) -> None:
        """Clean stop: everything is already down; the sidecar's final sweep finds nothing."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
