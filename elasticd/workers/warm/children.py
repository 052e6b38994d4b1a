"""The workers a zygote forked, as the daemon keeps them: pinned by pidfds, exits believed only when
the kernel agrees. Everything the zygote says about them is untrusted (``zygote``).

- A reported pid is adopted only while it is the zygote's child (``/proc/<pid>/stat``, read after
  a pidfd pins the process); from then on the pidfd names that process and no other.
- An exit status is believed only once the pidfd says the process has ended; when the report does
  not come within ``EXIT_REPORT_S``, or the zygote can no longer report, the worker counts as killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

from elasticd import log
from elasticd.workers.warm.spawn import ZygoteError, ended, parent_of

_log = log.get("elasticd.zygote")

EXIT_REPORT_S = 30.0  # for the exit status of a worker the kernel says has ended (a swamped node is slow)


class Bogus(ZygoteError):
    """The zygote reported a pid it cannot have forked: it is not to be trusted any more."""


class _Child:
    def __init__(self, pid: int, pidfd: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.exited = exited
        self.timer: asyncio.TimerHandle | None = None


class Children:
    """One zygote's running workers. Methods run on the event-loop thread."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, job: Callable[[], str], reporting: Callable[[], bool]
    ) -> None:
        """``job``: the job served, for log lines; ``reporting``: whether the zygote can still report
        exits (it is READY)."""
        self._loop = loop
        self._job = job
        self._reporting = reporting
        self._children: dict[int, _Child] = {}
        # Pids a fork answer named, not adopted yet, and the exit status reported for each meanwhile.
        self._named: dict[int, int | None] = {}

    def __len__(self) -> int:
        return len(self._children)

    def __contains__(self, pid: object) -> bool:
        return pid in self._children

    def pids(self) -> list[int]:
        return sorted(self._children)

    def named(self, pid: int) -> None:
        """A fork answer named ``pid``: an exit reported before its adoption (a store host's end
        can beat it) is kept for it (``adopt``)."""
        self._named[pid] = None

    def awaits(self, pid: int) -> bool:
        """Whether the zygote may report ``pid``'s exit: a worker kept here, or a named one."""
        return pid in self._children or pid in self._named

    def adopt(self, pid: int, zygote: int | None) -> tuple[asyncio.Future[int], str | None]:
        """Pin the reported pid with a pidfd and check it is ``zygote``'s child: its exit future,
        and what is wrong with an exit reported before (``reported``), if anything. Raises
        ``Bogus`` (the caller gives the zygote up)."""
        early = self._named.pop(pid, None)
        if pid in self._children:
            raise Bogus(f"reported pid {pid} twice")
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # ended and reaped already: its exit report follows
            pidfd = -1
        except OSError as exc:
            raise Bogus(f"pidfd_open({pid}): {exc}") from exc
        if pidfd >= 0 and parent_of(pid) not in (zygote, None):
            os.close(pidfd)
            raise Bogus(f"reported pid {pid}, which is not its child")
        exited: asyncio.Future[int] = self._loop.create_future()
        child = _Child(pid, pidfd, exited)
        self._children[pid] = child
        if pidfd >= 0:
            self._loop.add_reader(pidfd, self._ended, child)
        else:
            self._ended(child)
        return exited, self.reported(pid, early) if early is not None else None

    def place(self, pid: int, procs_fd: int | None, cpus: frozenset[int] | None = None) -> None:
        """Move the new worker into its rank's tracking cgroup, and bind it to ``cpus``, while it
        waits for its go (it is one thread then: the threads it starts inherit the binding).

        The daemon writes the pid itself: a ``cgroup.procs`` fd opened by root would let whoever
        holds it move *any* process there (the kernel checks the opener's credentials), so it is
        never handed to the zygote. The pid is the zygote's child, pinned by a pidfd: alive
        before and after the write, it is the process the write moved."""
        child = self._children.get(pid)
        if child is None or child.pidfd < 0 or ended(child.pidfd):
            return
        if cpus is not None:
            try:
                os.sched_setaffinity(child.pid, cpus)
            except OSError as exc:  # it ended meanwhile: its exit is reported as any other
                _log.error("zygote.bind_failed", job=self._job(), pid=child.pid, error=str(exc))
        if procs_fd is None:
            return
        try:
            os.write(procs_fd, str(child.pid).encode())
        except OSError as exc:  # it ended meanwhile, or the leaf is gone: it runs in the zygote's
            _log.error("tracking.join_failed", job=self._job(), pid=child.pid, error=str(exc))
        if ended(child.pidfd):  # it ended during the write: in theory its pid named another process
            _log.error("zygote.placement_raced", job=self._job(), pid=child.pid)

    def reported(self, pid: int, status: int) -> str | None:
        """The zygote reports ``pid``'s wait status (``awaits``); what is wrong with the report, if
        anything. A named pid's is kept for its adoption, and believed then."""
        if pid not in self._children and pid in self._named:
            self._named[pid] = status
            return None
        child = self._children[pid]
        if child.pidfd >= 0 and not ended(child.pidfd):
            return f"reported pid {child.pid} exited while it runs"
        try:
            code = os.waitstatus_to_exitcode(status)
        except ValueError:
            return f"status {status} of pid {child.pid}"
        self._resolve(child, code)
        return None

    def orphaned(self, kill: bool) -> None:
        """The zygote can report no more: ``kill`` the running workers (SIGKILL by pidfd, which
        cannot be refused; without ``kill``, their parent-death signal ended them with the zygote).
        Each counts as ended now, its status the zygote's report if one comes."""
        for child in list(self._children.values()):
            if kill and child.pidfd >= 0:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            self._ended(child)

    def _ended(self, child: _Child) -> None:
        """The kernel says the worker has ended; its status is the zygote's to report."""
        if child.pidfd >= 0:
            self._loop.remove_reader(child.pidfd)
        if not self._reporting():
            self._resolve(child, -signal.SIGKILL, "zygote gone")
        elif child.timer is None:
            child.timer = self._loop.call_later(
                EXIT_REPORT_S, self._resolve, child, -signal.SIGKILL, "exit not reported"
            )

    def _resolve(self, child: _Child, code: int, why: str = "") -> None:
        if why:
            _log.warning("zygote.exit_unknown", job=self._job(), pid=child.pid, why=why)
        if child.timer is not None:
            child.timer.cancel()
        if child.pidfd >= 0:
            self._loop.remove_reader(child.pidfd)
            os.close(child.pidfd)
            child.pidfd = -1
        self._children.pop(child.pid, None)
        if not child.exited.done():
            child.exited.set_result(code)
