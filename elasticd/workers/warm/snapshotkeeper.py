"""The daemon's side of a job's snapshot keeper: start it, learn its socket, stop it.

The keeper (``workers.snapshot_program.keeper``) holds a job's newest snapshots in memory on this
node, so it must outlive the job's workers: like the zygote it is started when the job is admitted
here (its own leaf of the job's tracking cgroup, ``snapshots``, which a worker group's stop spares,
and a marker of its own, which no sweep of the job's workers matches) and stopped when the job
ends here. It runs the job's own interpreter as the submitter, so everything it says is untrusted:
the daemon takes one bounded ``ready`` message (its pid, and the path of its socket, which it
passes on to the workers' environment) and never opens the socket nor a segment.

After a worker group here stopped (``persist``) and when the job ends here (``close``), the keeper
writes the newest snapshot of each checkpoint file to the user's path itself, as the user
(``snapshot_program.filing``); its reports of that are bounded and only logged, and ``close``
waits for them, within ``PERSIST_TIMEOUT_S``, before it stops the keeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from dataclasses import dataclass, field

from elasticd import log
from elasticd.workers.proctree.helper import Program, Seat, StopPolicy, exit_future, launch, stop
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.proctree.spawn import Identity
from elasticd.workers.snapshot_program.protocol import (
    KEEPER_NAME,
    MAX_CONTROL,
    BadMessage,
    KeeperConfig,
    KeeperReady,
    KeeperUnavailable,
    Order,
    Report,
    WriteReport,
    decode_control,
    encode_control,
)

_log = log.get("elasticd.snapshots")

PARTS = (
    "protocol.py",
    "replies.py",
    "requests.py",
    "replica.py",
    "filing.py",
    "keeper.py",
    "peers.py",
    "main.py",
)  # run in this order, in one namespace
PROGRAM = "elasticd.workers.snapshot_program"
KEEPER = Program(PROGRAM, PARTS, KEEPER_NAME, "<elasticd-keeper>", "elasticd-keeper")
READY_TIMEOUT_S = 30.0  # an interpreter's start, without torch
STOP_TIMEOUT_S = 5.0
# Its writers are in its process group: they go with it.
KEEPER_STOP = StopPolicy(grace_s=STOP_TIMEOUT_S, group=True)
PERSIST_TIMEOUT_S = 130.0  # the keeper's own bound on a write (filing.WRITE_TIMEOUT_S), and a margin


@dataclass(frozen=True)
class KeeperSetup:
    job_id: str
    python: str
    cwd: str
    env: dict[str, str] = field(hash=False)
    identity: Identity | None
    bound: int  # bytes the job's snapshots may hold on this node (setting snapshot_bytes)
    address: str = ""  # where it listens for other keepers (this node's address; "": no replication)


def parse_ready(data: bytes, pid: int) -> str:
    """The socket path of the keeper's ``ready`` message; raises ``ValueError`` for anything else."""
    msg = decode_control(data)
    if isinstance(msg, KeeperUnavailable):
        raise ValueError(f"unavailable: {msg.reason}")
    if not isinstance(msg, KeeperReady) or msg.pid != pid:
        raise ValueError("not a ready message of this keeper")
    return msg.socket


def parse_report(data: bytes) -> WriteReport:
    """A keeper's report of a write behind; raises ``ValueError`` (``BadMessage``) for anything else."""
    msg = decode_control(data)
    if not isinstance(msg, WriteReport):
        raise BadMessage("not a report")
    return msg


class SnapshotKeeper:
    """One job's keeper on this node. Methods run on the event-loop thread (the parent-death
    signal is tied to the thread that forks)."""

    def __init__(self, setup: KeeperSetup, reaper: Reaper, procs_fd: int | None) -> None:
        self.setup = setup
        self.marker = f"snapshots-{os.urandom(8).hex()}"
        self.socket_path: str | None = None
        self._reaper = reaper
        self._procs_fd = procs_fd
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ready: asyncio.Task[str | None] | None = None
        self._reports: asyncio.Task[None] | None = None
        self._closing = False
        self._exit: asyncio.Future[int] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def spawn(self) -> None:
        procs_fd, self._procs_fd = self._procs_fd, None
        setup = self.setup
        seat = Seat(setup.python, setup.cwd, setup.env, setup.identity, self.marker)
        config = encode_control(KeeperConfig(setup.bound, setup.address))
        try:
            started = launch(seat, KEEPER, config, procs_fd)
        except (OSError, subprocess.SubprocessError) as exc:
            _log.warning("snapshots.unavailable", job=setup.job_id, reason=f"cannot start: {exc}")
            return
        self._proc, self._sock = started.proc, started.sock
        self._exit = exit_future(started.proc, started.pidfd)
        self._exit.add_done_callback(self._died)
        self._reaper.track(self._proc.pid)
        self._ready = asyncio.ensure_future(self._await_ready())
        _log.info("snapshots.spawned", job=setup.job_id, pid=self._proc.pid, bound=setup.bound)

    async def _await_ready(self) -> str | None:
        assert self._sock is not None and self._proc is not None
        loop = asyncio.get_running_loop()
        try:
            data = await asyncio.wait_for(loop.sock_recv(self._sock, MAX_CONTROL + 1), READY_TIMEOUT_S)
            self.socket_path = parse_ready(data, self._proc.pid)
        except (TimeoutError, OSError, ValueError) as exc:
            reason = "not ready in time" if isinstance(exc, TimeoutError) else str(exc) or "closed"
            _log.warning("snapshots.unavailable", job=self.setup.job_id, pid=self._proc.pid, reason=reason)
            await self.close()
            return None
        _log.info("snapshots.ready", job=self.setup.job_id, pid=self._proc.pid, socket=self.socket_path)
        self._reports = asyncio.ensure_future(self._listen(loop, self._sock))
        return self.socket_path

    async def _listen(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        """Log the keeper's reports until it closes its end (or the daemon closes ours)."""
        job = self.setup.job_id
        while True:
            try:
                data = await loop.sock_recv(sock, MAX_CONTROL + 1)
            except OSError:
                return
            if not data:
                return
            try:
                report = parse_report(data)
            except ValueError as exc:
                _log.warning("snapshots.bad_report", job=job, error=str(exc))
                continue
            say = _log.warning if report.report is Report.PERSIST_FAILED else _log.info
            say(f"snapshots.{report.report.value}", job=job, **report.fields())

    def persist(self) -> None:
        """The job's workers here have stopped: the keeper writes each checkpoint file's newest
        snapshot that no worker wrote (a failure's), in the background."""
        if self._sock is None or self.socket_path is None:
            return
        try:
            self._sock.send(encode_control(Order.PERSIST))
        except OSError as exc:  # full (the keeper is not reading) or gone: the close asks again
            _log.warning("snapshots.persist_unsent", job=self.setup.job_id, error=str(exc))

    def _died(self, exited: asyncio.Future[int]) -> None:
        """Say so when the keeper dies once ready and before the job ends here: its snapshots are
        gone, and the workers write their checkpoints to disk from then on (a keeper is never
        restarted). One that dies before it is ready says so through ``ready``."""
        if exited.cancelled() or self._closing or self.socket_path is None or self._proc is None:
            return
        _log.warning("snapshots.lost", job=self.setup.job_id, pid=self._proc.pid, status=exited.result())

    async def _last_writes(self) -> None:
        """Shut our end for writing (the keeper's EOF: the job ended here) and read its reports
        until it closes its end, within ``PERSIST_TIMEOUT_S``."""
        reports, self._reports = self._reports, None
        if reports is None or self._sock is None:
            return
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        try:
            await asyncio.wait_for(asyncio.shield(reports), PERSIST_TIMEOUT_S)
        except TimeoutError:
            _log.warning("snapshots.persist_abandoned", job=self.setup.job_id, after_s=PERSIST_TIMEOUT_S)
            reports.cancel()

    async def ready(self) -> str | None:
        """The keeper's socket path, once it listens; None when it will not."""
        task = self._ready
        if task is None:
            return None
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # closed before it was ready
                return None
            raise

    async def close(self) -> None:
        """Stop the keeper: told the job ended here (our end of its control socket shut for
        writing), it writes its last snapshots behind, frees its segments, removes its directory
        and exits; its reports are read until then, within ``PERSIST_TIMEOUT_S``. Killed, with its
        writers, if it has not gone within ``STOP_TIMEOUT_S`` after."""
        task = self._ready
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        self._closing = True
        await self._last_writes()
        sock, self._sock = self._sock, None
        proc, self._proc = self._proc, None
        if self._exit is not None:
            self._exit.cancel()  # the stop reaps it
        if sock is not None:
            sock.close()
        if proc is None:
            return
        await asyncio.to_thread(stop, proc, KEEPER_STOP)
        self._reaper.untrack(proc.pid)
        _log.info("snapshots.closed", job=self.setup.job_id, pid=proc.pid, returncode=proc.returncode)
