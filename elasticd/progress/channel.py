"""The pipe a worker reports its progress on: the daemon keeps the read end, the worker inherits
the write end as ``ELASTICD_PROGRESS_FD`` (and ``ELASTICD_HEARTBEAT_FILE=/dev/fd/<n>``, for tools
that want a file name: opening ``/dev/fd/<n>`` of a pipe opens that pipe again).

No file system path is involved: nothing for a job to plant a link at, nothing to clean up. The
pipe is handed to the worker's user (``fchown``) because reopening it through ``/dev/fd`` checks
the pipe's owner, which would otherwise be root.

The worker is untrusted and may write anything at any rate. The reader takes at most
``READ_BUDGET`` bytes per wake-up, and pauses for ``PAUSE_S`` once a worker has sent more than
``RATE_BYTES`` within a second: a flood costs the daemon a bounded amount of CPU, and the flooder
blocks or drops its own writes, nobody else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from elasticd.progress.protocol import LineSplitter, Report

READ_BUDGET = 4096
RATE_BYTES = 16 * 1024  # per second; a worker reporting every millisecond sends about 12 KiB/s
PAUSE_S = 1.0


class ProgressChannel:
    def __init__(self, owner: tuple[int, int] | None = None) -> None:
        """``owner``: (uid, gid) of the worker that will write, when the daemon switches users."""
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if owner is not None:
                os.fchown(self.write_fd, *owner)
        except BaseException:
            self.close()
            raise
        self._splitter = LineSplitter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_report: Callable[[Report], None] = lambda report: None
        self._reading = False
        self._window_start = 0.0
        self._window_bytes = 0
        self._resume: asyncio.TimerHandle | None = None
        self.bytes_read = 0
        self.pauses = 0

    @property
    def junk(self) -> int:
        """Lines dropped: not a report, or too long."""
        return self._splitter.junk

    def close_write(self) -> None:
        """The worker has its copy (or never will): the daemon must not keep one, or the pipe
        would never report the end of the worker's tree, and the next worker could inherit it."""
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def start(self, on_report: Callable[[Report], None]) -> None:
        """Read reports on the running loop's thread; ``on_report`` is called for each valid one."""
        self._loop = asyncio.get_running_loop()
        self._on_report = on_report
        self._watch()

    def _watch(self) -> None:
        self._resume = None
        if self._loop is not None and self.read_fd >= 0 and not self._reading:
            self._loop.add_reader(self.read_fd, self._readable)
            self._reading = True

    def _unwatch(self) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self.read_fd)
            self._reading = False

    def _readable(self) -> None:
        assert self._loop is not None
        try:
            data = os.read(self.read_fd, READ_BUDGET)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # every writer is gone: the worker's tree has exited
            self._close_read()
            return
        self.bytes_read += len(data)
        for report in self._splitter.feed(data):
            self._on_report(report)
        now = self._loop.time()
        if now - self._window_start >= 1.0:
            self._window_start, self._window_bytes = now, 0
        self._window_bytes += len(data)
        if self._window_bytes > RATE_BYTES:
            self.pauses += 1
            self._unwatch()
            self._window_start, self._window_bytes = now + PAUSE_S, 0
            self._resume = self._loop.call_later(PAUSE_S, self._watch)

    def drain(self, most: int = 16) -> None:
        """Read the reports already written, now (at most ``most`` reads): a worker that exited
        wrote its last ones before, and whatever the exit decides must see them first."""
        for _ in range(most):
            before = self.bytes_read
            if self.read_fd < 0 or self._loop is None:
                return
            self._readable()
            if self.bytes_read == before:
                return

    def _close_read(self) -> None:
        self._unwatch()
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self.read_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            self.read_fd = -1

    def close(self) -> None:
        self._close_read()
        self.close_write()
