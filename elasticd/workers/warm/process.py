"""A zygote's process as the daemon holds it: our child, pinned by a pidfd, and our end of its
control socket (``zygote.Zygote`` decides what it says and what its end means).

It stays our unreaped child until it is shut, so its pid names it and no other process: the daemon
may move it between cgroups and read its memory by pid. The event loop watches the socket and the
pidfd, with no thread and no polling. Shutting it stops the watch, closes both, kills it at once
(``ZYGOTE_STOP``: its workers are stopped by their group, never through it) and reaps it in a
thread, off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Callable

import psutil

from elasticd.workers.proctree.helper import Started, kill, launch
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.warm.messages import MAX_MESSAGE
from elasticd.workers.warm.spawn import SNDBUF, ZYGOTE, ZYGOTE_STOP, ZygoteError, ZygoteSetup, ended


class ZygoteProcess:
    """A started zygote's process. Methods run on the event-loop thread."""

    def __init__(
        self, started: Started, reaper: Reaper, readable: Callable[[], None], died: Callable[[], None]
    ) -> None:
        """Watch ``started``: ``readable`` is called when its socket has messages, ``died`` when it
        ended (tracked by ``reaper`` until it is shut)."""
        self.pid = started.proc.pid
        self._loop = asyncio.get_running_loop()
        self._reaper = reaper
        self._popen: subprocess.Popen[bytes] | None = started.proc
        self._sock: socket.socket | None = started.sock
        self._pidfd: int | None = started.pidfd
        self._reaping: asyncio.Future[int] | None = None
        reaper.track(self.pid)
        self._loop.add_reader(started.sock.fileno(), readable)
        self._loop.add_reader(started.pidfd, died)

    @classmethod
    def start(
        cls,
        setup: ZygoteSetup,
        marker: str,
        procs_fd: int | None,
        source: bytes | None,
        reaper: Reaper,
        readable: Callable[[], None],
        died: Callable[[], None],
    ) -> ZygoteProcess:
        """Start ``setup``'s zygote with its own ``marker``, in the tracking cgroup leaf ``procs_fd``
        (closed here), running ``source`` (tests pass fake zygotes; None: ``ZYGOTE``'s program),
        and watch it (``__init__``). Raises ``OSError`` or ``subprocess.SubprocessError`` when it
        cannot start."""
        seat, config = setup.seat(marker), setup.config()
        started = launch(seat, ZYGOTE, config, procs_fd, source=source, sndbuf=SNDBUF)
        return cls(started, reaper, readable, died)

    def receive(self) -> tuple[bytes, bool] | None:
        """The next message (empty: it closed its end), and whether it was cut short (longer than
        ``MAX_MESSAGE``); None when none is waiting or the socket is shut. Raises ``OSError`` when
        the socket failed."""
        if self._sock is None:
            return None
        try:
            data, _, flags, _ = self._sock.recvmsg(MAX_MESSAGE + 1)
        except (BlockingIOError, InterruptedError):
            return None
        return data, bool(flags & socket.MSG_TRUNC)

    def send(self, request: dict[str, object], fds: list[int]) -> None:
        """One request, ``fds`` attached (``SCM_RIGHTS``); ``ZygoteError`` when it cannot go."""
        if self._sock is None:
            raise ZygoteError(f"cannot send the {request['op']} request: the zygote is shut")
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
        except OSError as exc:  # EMSGSIZE: an environment too large for one message; EAGAIN: stuck
            raise ZygoteError(f"cannot send the {request['op']} request: {exc}") from exc

    def status(self) -> int | None:
        """Its exit status, once its pidfd says it ended (None: it was shut)."""
        return self._popen.wait() if self._popen is not None else None

    def move_to(self, procs_fd: int) -> bool:
        """Write its pid to ``procs_fd`` (a cgroup's ``cgroup.procs``): alive after the write, the
        write moved it. False when it has ended or was shut; ``OSError`` when the write failed."""
        if self._pidfd is None or ended(self._pidfd):
            return False
        os.write(procs_fd, str(self.pid).encode())
        return not ended(self._pidfd)

    def rss(self) -> int | None:
        """Its resident memory (bytes), None when it cannot be read."""
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except psutil.Error:
            return None

    def shut(self) -> None:
        """Stop watching it, close our ends, kill it and reap it in a thread (again: nothing)."""
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        proc, self._popen = self._popen, None
        if proc is not None:
            kill(proc, ZYGOTE_STOP)
            self._reaper.untrack(proc.pid)
            self._reaping = asyncio.ensure_future(asyncio.to_thread(proc.wait))

    async def reaped(self) -> None:
        """Once it was shut: wait until it is reaped."""
        if self._reaping is not None:
            with contextlib.suppress(Exception):
                await self._reaping
