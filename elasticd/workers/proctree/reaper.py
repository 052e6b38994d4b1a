"""The reaper sidecar: it outlives a crashed or frozen daemon just long enough to kill its workers.

The daemon starts it with a pipe on stdin and tells it, one line at a time:
- ``track <pgid> [<job> [<marker>...]]``: a worker's process group; with a job id the group is
  *fenced*; markers: other ``ELASTICD_JOB`` values its processes carry (its zygote's);
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
  job's tracking cgroup ``<base>/<job>`` is killed with them, every leaf but its snapshot keeper's,
  and every process marked with the job or one of its groups' markers. The keeper trains nothing,
  so it cannot make two rounds run at once; it holds the job's newest snapshots, which the node
  resumes from when it rejoins (every node of a job is fenced at once when etcd itself is away).
  It goes with the daemon, or when the daemon stops it at the job's end here.

Run as ``python -I -S -c <import this module> elasticd.workers.proctree.reaper OWNER [CGROUP_BASE]``
(``Reaper.start``; ``python -m elasticd.workers.proctree.reaper OWNER [CGROUP_BASE]`` works too);
``CGROUP_BASE`` is the daemon's ``Tracker.base`` (absent where there is no tracking cgroup). It
sits in its own session and ignores SIGINT/SIGTERM/SIGHUP so that a Ctrl-C or a stop aimed at the
daemon does not take it first.

The sidecar part of this module (everything above ``Reaper``) imports the standard library only,
and runs isolated (``-I``: no environment, no user site, no cwd on ``sys.path``) without
``site`` (``-S``: no site-packages): it idles at about 9 MB RSS instead of 25 MB with psutil,
structlog and the package's cgroup code loaded, and nothing on a user's path can run in it as
root. So it repeats, in a few lines, the kernel mechanics it needs from ``workers.cgroups.kill``
(``cgroup.kill``, rmdir with retries), ``workers.proctree.markers`` (the environment marker, read
from ``/proc/<pid>/environ``) and ``workers.cgroups.limits`` (the job-id check), and logs JSON lines itself;
``tests/unit/test_unit_reaper.py`` checks that the shared names and rules agree.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # (not typing's: the sidecar does without importing it)
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any

# Shared with the daemon's modules (tests/unit/test_unit_reaper.py checks that they agree).
OWNER_ENV = "ELASTICD_OWNER"  # workers.proctree.markers
JOB_ENV = "ELASTICD_JOB"  # workers.proctree.markers
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
V2_JOBS = "elasticd.jobs"  # workers.cgroups.fs: the parent of every daemon's base on this host
SNAPSHOTS_LEAF = "snapshots"  # workers.cgroups.tracking: a job's keeper, which a fence spares
KILL_WAIT_S = 5.0  # workers.cgroups.kill: how long a sweep waits for the kernel to empty the base
_BUSY = (errno.EBUSY, errno.ENOTEMPTY)
STOP_GRACE_S = 10.0  # the daemon's clean stop: the sidecar's final sweep, which finds nothing


def valid_job(name: str) -> bool:
    """``workers.cgroups.limits.check_name``'s rule (a job id usable as one path component), without re."""
    return 0 < len(name) <= 200 and name[0] in _ALNUM and all(c in _ALNUM or c in "_.-" for c in name)


def _log(level: str, event: str, **fields: Any) -> None:
    """One JSON line on stderr (the daemon's): rare, only when the sidecar acts."""
    import json  # only then

    line = {"event": event, "level": level, "logger": "elasticd.reaper", "timestamp": time.time()} | fields
    try:
        sys.stderr.write(json.dumps(line, default=str) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _kill_cgroup(cgroup: str, wait_s: float) -> bool:
    """``cgroup.kill``; with ``wait_s``, wait for ``cgroup.events`` to say it is empty."""
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except FileNotFoundError:
        return True
    except OSError as exc:
        _log("error", "tracking.kill_failed", cgroup=cgroup, error=str(exc))
        return False
    deadline = time.monotonic() + wait_s
    while _populated(cgroup):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _populated(cgroup: str) -> bool:
    try:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            text = f.read()
    except OSError:
        return False
    return any(line.split() == ["populated", "1"] for line in text.splitlines())


def _rmdir(cgroup: str, tries: int = 1) -> bool:
    for attempt in range(tries):
        try:
            os.rmdir(cgroup)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in _BUSY:
                _log("warning", "limits.rmdir_failed", path=cgroup, error=str(exc))
                return False
        if attempt + 1 < tries:
            time.sleep(0.01 * (attempt + 1))
    return False


def _subdirs(cgroup: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(cgroup) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _remove_tree(cgroup: str) -> bool:
    """Deepest first; a cgroup can stay busy for a moment after its last process died."""
    children = _subdirs(cgroup)
    emptied = all([_remove_tree(child) for child in children])
    return _rmdir(cgroup, tries=5) and emptied


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; None where the kernel has none (< 5.3) or the process is gone."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _marked(owner: str, jobs: frozenset[str] = frozenset()) -> list[tuple[int, int | None]]:
    """(pid, pidfd) of the processes whose environment says they belong to this node (and to one of
    ``jobs``, when given: job ids or zygotes' markers).

    The pidfd is opened before the environment is read, so that a pid reused in between is never
    signalled by mistake: the fd names the process that was read (or one that is gone).
    """
    wanted = {job.encode() for job in jobs}
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fd = _pidfd(int(name))
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = {k: v for k, _, v in (item.partition(b"=") for item in f.read().split(b"\0"))}
        except OSError:
            env = {}
        if (
            env
            and env.get(OWNER_ENV.encode()) == owner.encode()
            and (not wanted or env.get(JOB_ENV.encode()) in wanted)
        ):
            found.append((int(name), fd))
        elif fd is not None:
            os.close(fd)
    return found


def _kill_now(procs: list[tuple[int, int | None]], pgids: list[int]) -> None:
    """SIGKILL the tracked groups, then every marked process."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid, fd in procs:
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        finally:
            if fd is not None:
                os.close(fd)


def _kill_job_but_keeper(cgroup: str) -> None:
    """Kill every leaf of a job's cgroup but the keeper's (a job's processes live in leaves only:
    its ranks', its zygote's, its keeper's)."""
    for leaf in _subdirs(cgroup):
        if os.path.basename(leaf) != SNAPSHOTS_LEAF:
            _kill_cgroup(leaf, wait_s=0)  # the kernel takes it from here


def _fence(owner: str, fenced: dict[int, tuple[str, ...]], base: str | None) -> None:
    jobs = {marks[0] for marks in fenced.values()}
    for job in sorted(jobs):
        if base is not None and valid_job(job):  # the daemon sends only job ids
            _kill_job_but_keeper(os.path.join(base, job))
    marks = frozenset(m for ms in fenced.values() for m in ms)
    _kill_now(_marked(owner, marks), sorted(fenced))
    fenced.clear()


def _daemon_gone(owner: str, tracked: set[int], base: str | None) -> None:
    if base is not None and os.path.isdir(base):
        if not _kill_cgroup(base, KILL_WAIT_S):  # every job at once
            _log("error", "tracking.unkillable", cgroup=base)
        for job in _subdirs(base):
            if _remove_tree(job):
                _log("info", "tracking.swept", cgroup=job)
            else:
                _log("warning", "tracking.cgroup_busy", cgroup=job)
    parent = os.path.dirname(base) if base is not None else ""
    if base is not None and _rmdir(base) and os.path.basename(parent) == V2_JOBS:
        _rmdir(parent)  # busy while other daemons of this host use it
    _kill_now(_marked(owner), sorted(tracked))


def main(argv: list[str]) -> int:
    owner = argv[1]
    base = os.path.normpath(argv[2]) if len(argv) > 2 else None
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    tracked: set[int] = set()
    fenced: dict[int, tuple[str, ...]] = {}
    deadline = 0.0
    buffer = b""
    stdin = sys.stdin.fileno()
    while True:
        wait = max(0.0, deadline - time.monotonic()) if deadline and fenced else None
        ready, _, _ = select.select([stdin], [], [], wait)
        if not ready:
            _fence(owner, fenced, base)
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            verb, *args = line.decode(errors="replace").split()
            if verb == "track" and args and args[0].isdigit():
                tracked.add(int(args[0]))
                if len(args) > 1:
                    fenced[int(args[0])] = tuple(args[1:])
            elif verb == "untrack" and args and args[0].isdigit():
                tracked.discard(int(args[0]))
                fenced.pop(int(args[0]), None)
            elif verb == "deadline" and args:
                deadline = float(args[0])
    _daemon_gone(owner, tracked, base)
    return 0


# The command that runs the sidecar: isolated, without site, with only this package's root on
# sys.path (so that ``import elasticd.workers.proctree.reaper`` finds this file and nothing else of a
# user's).
# ``argv[0]`` is the module's name, so that ``ps`` (and tests) can tell the sidecar by it.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[:2]; "
    "from elasticd.workers.proctree.reaper import main; raise SystemExit(main(sys.argv))"
)


def command(owner: str, cgroup_base: Path | None) -> list[str]:
    base = [str(cgroup_base)] if cgroup_base is not None else []
    return [sys.executable, "-I", "-S", "-c", _BOOT, _ROOT, "elasticd.workers.proctree.reaper", owner, *base]


class Reaper:
    """The daemon's handle on its sidecar."""

    def __init__(self, owner: str, cgroup_base: Path | None = None) -> None:
        self._owner = owner
        self._cgroup_base = cgroup_base
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        import subprocess

        from elasticd.workers.proctree.spawn import child_env

        self._proc = subprocess.Popen(
            command(self._owner, self._cgroup_base),
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

    def track(self, pgid: int, fence_job: str | None = None, markers: Sequence[str] = ()) -> None:
        """``markers``: of a fenced group only (a job id or a marker is one word: no spaces)."""
        self._send(" ".join(["track", str(pgid), fence_job, *markers]) if fence_job else f"track {pgid}")

    def untrack(self, pgid: int) -> None:
        self._send(f"untrack {pgid}")

    def set_deadline(self, monotonic_deadline: float) -> None:
        self._send(f"deadline {monotonic_deadline:.3f}")

    def close(self) -> None:
        """Clean stop: everything is already down; the sidecar's final sweep finds nothing. Asked
        by its stdin's EOF, then stopped by the helpers' one policy (``proctree.helper``): it has
        ``STOP_GRACE_S`` to end, then it alone is killed (its session holds nothing else)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        from elasticd.workers.proctree.helper import StopPolicy, stop

        stop(proc, StopPolicy(grace_s=STOP_GRACE_S, group=False))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
