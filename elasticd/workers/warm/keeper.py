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
import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from elasticd import log
from elasticd.decode import parse_json
from elasticd.workers.group import before_drop
from elasticd.workers.proctree.markers import JOB_ENV
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.proctree.spawn import Identity, worker_preexec
from elasticd.workers.snapshot_program.protocol import KEEPER_NAME, REPORTS

_log = log.get("elasticd.snapshots")

PROGRAM = "elasticd.workers.snapshot_program"
PARTS = (
    "protocol.py",
    "replica.py",
    "filing.py",
    "keeper.py",
    "peers.py",
    "main.py",
)  # run in this order, in one namespace
LOADER = (
    "import os;g={{'__name__':'" + KEEPER_NAME + "','CTL_FD':{ctl}}};"
    "[exec(compile(p,'<elasticd-keeper>','exec'),g) for p in "
    "b''.join(iter(lambda:os.read({src},65536),b'')).split(b'\\0')]"
)
READY_TIMEOUT_S = 30.0  # an interpreter's start, without torch
STOP_TIMEOUT_S = 5.0
MAX_READY = 4096
MAX_SOCKET_PATH = 107  # sun_path, less its NUL
PERSIST_TIMEOUT_S = 130.0  # the keeper's own bound on a write (filing.WRITE_TIMEOUT_S), and a margin
MAX_REPORT = 1024


@dataclass(frozen=True)
class KeeperSetup:
    job_id: str
    python: str
    cwd: str
    env: dict[str, str] = field(hash=False)
    identity: Identity | None
    bound: int  # bytes the job's snapshots may hold on this node (setting snapshot_bytes)
    address: str = ""  # where it listens for other keepers (this node's address; "": no replication)


def program_source() -> bytes:
    files = resources.files(PROGRAM)
    return b"\0".join(files.joinpath(name).read_bytes() for name in PARTS)


def _small_object(data: bytes, bound: int) -> dict[str, Any]:
    """A keeper's message: a JSON object of at most ``bound`` bytes, checked before it is
    decoded; ``ValueError`` (``DecodeError`` for bad JSON) for anything else."""
    if len(data) > bound:
        raise ValueError(f"message over {bound} bytes")
    msg = parse_json(data)
    if not isinstance(msg, dict):
        raise ValueError("not an object")
    return msg


def parse_ready(data: bytes, pid: int) -> str:
    """The socket path of the keeper's ``ready`` message; raises ``ValueError`` for anything else."""
    msg = _small_object(data, MAX_READY)
    if msg.get("ev") == "unavailable":
        raise ValueError(f"unavailable: {str(msg.get('reason'))[:200]}")
    path = msg.get("socket")
    if msg.get("ev") != "ready" or msg.get("pid") != pid or not isinstance(path, str):
        raise ValueError("not a ready message of this keeper")
    if not path.startswith("/") or len(path.encode()) > MAX_SOCKET_PATH or "\0" in path or "\n" in path:
        raise ValueError("not a usable socket path")
    return path


def parse_report(data: bytes) -> dict[str, object]:
    """A keeper's report of its writes behind, as fields to log; raises ``ValueError``."""
    msg = _small_object(data, MAX_REPORT)
    if msg.get("ev") not in REPORTS:
        raise ValueError("not a report")
    step = msg.get("step")
    if type(step) is not int or not 0 <= step < 1 << 63:
        raise ValueError("no step")
    out: dict[str, object] = {"ev": msg["ev"], "step": step}
    took = msg.get("took_s")
    if isinstance(took, int | float) and not isinstance(took, bool) and 0 <= took < 1e6:
        out["took_s"] = float(took)
    if msg["ev"] == "persist_failed":
        out["reason"] = str(msg.get("reason"))[:300]
    return out


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
        self._pidfd = -1

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def spawn(self) -> None:
        procs_fd, self._procs_fd = self._procs_fd, None
        try:
            self._proc, self._sock = self._start(procs_fd)
        except (OSError, subprocess.SubprocessError) as exc:
            _log.warning("snapshots.unavailable", job=self.setup.job_id, reason=f"cannot start: {exc}")
            return
        self._reaper.track(self._proc.pid)
        self._ready = asyncio.ensure_future(self._await_ready())
        _log.info("snapshots.spawned", job=self.setup.job_id, pid=self._proc.pid, bound=self.setup.bound)

    def _start(self, procs_fd: int | None) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        src_r, src_w = os.pipe2(os.O_CLOEXEC)
        try:
            source = program_source()
            if len(source) >= 65536:  # written whole before the child reads: must fit the pipe
                raise OSError("the keeper's program is larger than a pipe's buffer")
            os.write(src_w, source)
            os.close(src_w)
            src_w = -1
            setup = self.setup
            proc = subprocess.Popen(
                [setup.python, "-c", LOADER.format(src=src_r, ctl=theirs.fileno()), "elasticd-keeper"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=setup.env | {JOB_ENV: self.marker},
                start_new_session=True,
                preexec_fn=worker_preexec(setup.cwd, setup.identity, before_drop(procs_fd, None)),
                close_fds=True,
                pass_fds=(src_r, theirs.fileno()),
            )
            ours.send(json.dumps({"bound": setup.bound, "address": setup.address}).encode())
            ours.setblocking(False)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(src_r)
            if src_w >= 0:
                os.close(src_w)
            if procs_fd is not None:
                os.close(procs_fd)
        return proc, ours

    async def _await_ready(self) -> str | None:
        assert self._sock is not None and self._proc is not None
        loop = asyncio.get_running_loop()
        try:
            data = await asyncio.wait_for(loop.sock_recv(self._sock, MAX_READY + 1), READY_TIMEOUT_S)
            self.socket_path = parse_ready(data, self._proc.pid)
        except (TimeoutError, OSError, ValueError) as exc:
            reason = "not ready in time" if isinstance(exc, TimeoutError) else str(exc) or "closed"
            _log.warning("snapshots.unavailable", job=self.setup.job_id, pid=self._proc.pid, reason=reason)
            await self.close()
            return None
        _log.info("snapshots.ready", job=self.setup.job_id, pid=self._proc.pid, socket=self.socket_path)
        self._watch(loop, self._proc)
        self._reports = asyncio.ensure_future(self._listen(loop, self._sock))
        return self.socket_path

    async def _listen(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        """Log the keeper's reports until it closes its end (or the daemon closes ours)."""
        job = self.setup.job_id
        while True:
            try:
                data = await loop.sock_recv(sock, MAX_REPORT + 1)
            except OSError:
                return
            if not data:
                return
            try:
                report = parse_report(data)
            except ValueError as exc:
                _log.warning("snapshots.bad_report", job=job, error=str(exc))
                continue
            event = report.pop("ev")
            say = _log.warning if event == "persist_failed" else _log.info
            say(f"snapshots.{event}", job=job, **report)

    def persist(self) -> None:
        """The job's workers here have stopped: the keeper writes each checkpoint file's newest
        snapshot that no worker wrote (a failure's), in the background."""
        if self._sock is None or self.socket_path is None:
            return
        try:
            self._sock.send(json.dumps({"op": "persist"}).encode())
        except OSError as exc:  # full (the keeper is not reading) or gone: the close asks again
            _log.warning("snapshots.persist_unsent", job=self.setup.job_id, error=str(exc))

    def _watch(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes]) -> None:
        """Say so when the keeper dies before the job ends here: its snapshots are gone, and the
        workers write their checkpoints to disk from then on."""
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            return

        def died() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._pidfd = -1
            if self._proc is proc and not self._closing:  # not its exit after the job's end
                _log.warning("snapshots.lost", job=self.setup.job_id, pid=proc.pid, status=proc.poll())

        self._pidfd = pidfd
        loop.add_reader(pidfd, died)

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
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        if sock is not None:
            sock.close()
        if proc is None:
            return
        try:
            await asyncio.to_thread(proc.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # its writers are in its process group
            await asyncio.to_thread(proc.wait)
        self._reaper.untrack(proc.pid)
        _log.info("snapshots.closed", job=self.setup.job_id, pid=proc.pid, returncode=proc.returncode)
