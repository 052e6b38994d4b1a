"""The daemon's side of a zygote: a warm parent that forks a job's workers, supervised.

A worker's start is mostly its interpreter's start and ``import torch``. The zygote does that once
per job and node (``process`` starts it; ``zygote_program.boot`` is its program); each attempt's
workers are forked from it, so a restart costs a fork instead of an import. When the job ends here
a healthy zygote may be parked for the next identical job (``warm.pool``).

Everything the zygote says is untrusted: it runs the user's interpreter and imports the user's
modules. So the daemon accepts a pid only for a fork it asked for and only while it is the
zygote's child, believes an exit only once the kernel agrees (``children``), bounds every
message (``messages``), and gives up on a zygote that says too much nonsense (``zygote.lost``).

States (``ZygoteState``): STARTING → READY when its ``ready`` message came, → UNAVAILABLE when it
could not start (import error, threads, CUDA, timeout: workers are spawned cold, with a
``zygote.unavailable`` line); READY → LOST when it died or misbehaved (its running workers are
killed and count as failed; later workers are spawned cold, ``zygote.lost``); any → CLOSED when
it is stopped (the job ended here and it was not parked, or the pool let it go). A parked zygote
stays READY: parking is the pool's state (``pool_decider.EntryState``), not the process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from enum import Enum

from elasticd import log
from elasticd.workers.group import Launch
from elasticd.workers.proctree.reaper import Reaper
from elasticd.workers.warm.children import Bogus, Children
from elasticd.workers.warm.messages import (
    Checked,
    Exited,
    Forked,
    ForkFailed,
    Message,
    Ready,
    Unavailable,
    parse_message,
)
from elasticd.workers.warm.pending import Pending
from elasticd.workers.warm.process import ZygoteProcess
from elasticd.workers.warm.spawn import ZygoteError, ZygoteSetup, new_marker

__all__ = ["Zygote", "ZygoteState"]

_log = log.get("elasticd.zygote")

READY_TIMEOUT_S = 60.0  # importing torch on a loaded node can take a while; longer means no zygote
FORK_TIMEOUT_S = 30.0  # for the zygote's reply to one fork request (milliseconds, unless the node is swamped)
CHECK_TIMEOUT_S = 30.0  # for its answer to a check (a stat of each file behind its modules)
MAX_BOGUS = 100  # nonsense messages before the zygote is given up


class ZygoteState(Enum):
    STARTING = "starting"
    READY = "ready"
    UNAVAILABLE = "unavailable"
    LOST = "lost"
    CLOSED = "closed"


class Zygote:
    """One zygote on this node. Methods run on the event-loop thread."""

    def __init__(
        self, setup: ZygoteSetup, reaper: Reaper, procs_fd: int | None = None, source: bytes | None = None
    ) -> None:
        """``procs_fd``: the job's tracking cgroup leaf for the zygote (``JobTracking.join_zygote``);
        the zygote joins it, so it dies with the job's cgroup. ``source``: the program (tests pass
        fake zygotes); ``zygote_program.boot``'s by default."""
        self.setup = setup
        self.job = setup.job_id  # the job it serves (another one's after an adoption)
        self.marker = new_marker()
        self.state = ZygoteState.STARTING
        self.reason = ""
        self.pid: int | None = None
        self.files = 0
        self.torch = False  # it imported torch (a script that cannot reach it gets one without)
        self._reaper = reaper
        self._procs_fd = procs_fd
        self._proc: ZygoteProcess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[bool] | None = None
        self._pending = Pending()
        self._children: Children | None = None
        self._bogus = 0
        self._started = 0.0
        self._source = source
        self._on_lost: Callable[[Zygote], None] | None = None
        self.helpers: set[int] = set()  # its children that are not workers (the store host)

    # -- start -----------------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the process (its imports run on while the caller goes on); see ``ready``."""
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._children = Children(self._loop, lambda: self.job, lambda: self.state is ZygoteState.READY)
        self._started = time.monotonic()
        procs_fd, self._procs_fd = self._procs_fd, None
        try:
            self._proc = ZygoteProcess.start(
                self.setup, self.marker, procs_fd, self._source, self._reaper, self._readable, self._died
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._unavailable(f"cannot start: {exc}")
            return
        self.pid = self._proc.pid
        self._loop.call_later(READY_TIMEOUT_S, self._ready_timeout)
        _log.info("zygote.spawned", job=self.job, pid=self.pid, python=self.setup.python)

    async def ready(self) -> bool:
        """Wait until the zygote is READY (True) or will not be (False)."""
        if self._ready is None:
            return False
        return await asyncio.shield(self._ready) and self.usable

    @property
    def usable(self) -> bool:
        return self.state is ZygoteState.READY

    @property
    def idle(self) -> bool:
        """READY, with no worker, request or nonsense on record: fit to be parked for another job."""
        busy = self._children is not None and len(self._children) > 0
        return self.usable and not busy and not self._pending and not self._bogus

    def _ready_timeout(self) -> None:
        if self.state is ZygoteState.STARTING:
            self._unavailable(f"not ready within {READY_TIMEOUT_S:g} s")

    def _unavailable(self, reason: str) -> None:
        if self.state is not ZygoteState.STARTING:
            return
        self.state, self.reason = ZygoteState.UNAVAILABLE, reason
        _log.warning("zygote.unavailable", job=self.job, pid=self.pid, reason=reason)
        self._shut()
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)

    # -- messages ---------------------------------------------------------------------------------
    def _readable(self) -> None:
        for _ in range(64):  # a bounded share of the loop per wake-up
            try:
                got = self._proc.receive() if self._proc is not None else None
            except OSError as exc:
                self._gone(f"control socket: {exc}")
                return
            if got is None:
                return
            data, cut = got
            if not data:
                self._gone("closed its control socket")
                return
            try:
                if cut:
                    raise ValueError("message too long")
                msg = parse_message(data)
            except ValueError as exc:
                self._nonsense(f"{exc}: {data[:80]!r}")
                continue
            self._handle(msg)

    def _nonsense(self, what: str) -> None:
        self._bogus += 1
        _log.warning("zygote.bogus", job=self.job, pid=self.pid, message=what)
        if self._bogus >= MAX_BOGUS:
            self._gone("too many bogus messages")

    def _handle(self, msg: Message) -> None:
        match msg:
            case Ready() if self.state is ZygoteState.STARTING:
                if msg.pid != self.pid:
                    self._unavailable(f"said its pid is {msg.pid}")
                    return
                self.state, self.files, self.torch = ZygoteState.READY, msg.files, msg.torch
                _log.info(
                    "zygote.ready",
                    job=self.job,
                    pid=self.pid,
                    import_s=msg.import_s,
                    ready_s=round(time.monotonic() - self._started, 4),
                    torch=msg.torch,
                    files=msg.files,
                )
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(True)
            case Unavailable() if self.state is ZygoteState.STARTING:
                self._unavailable(msg.reason)
            case Forked() | ForkFailed() | Checked() if self._pending.awaits(msg):
                if isinstance(msg, Forked) and self._children is not None:
                    self._children.named(msg.pid)
                self._pending.answer(msg)
            case Exited() if self._children is not None and self._children.awaits(msg.pid):
                wrong = self._children.reported(msg.pid, msg.status)
                if wrong is not None:
                    self._nonsense(wrong)
            case _:
                self._nonsense(f"unexpected {msg}")

    def _send(self, request: dict[str, object], fds: list[int]) -> None:
        if self._proc is None:
            raise ZygoteError(f"zygote {self.state.value}")
        self._proc.send(request, fds)

    # -- a parked zygote: is it still what a fresh process would be? ------------------------------
    async def check(self) -> Checked:
        """Ask whether every file behind its modules (and its interpreter) is as it was when it was
        ready: it stats them itself, as the user. Raises ``ZygoteError`` when it cannot answer."""
        if not self.usable or self._loop is None:
            raise ZygoteError(f"zygote {self.state.value}")
        rid = self._pending.rid()
        answer: asyncio.Future[Checked] = self._loop.create_future()
        self._pending.checks[rid] = answer
        try:
            self._send({"op": "check", "id": rid}, [])
            return await asyncio.wait_for(asyncio.shield(answer), CHECK_TIMEOUT_S)
        except TimeoutError:
            self._gone(f"no answer to a check within {CHECK_TIMEOUT_S:g} s")
            raise ZygoteError("the zygote did not answer") from None
        finally:
            self._pending.checks.pop(rid, None)

    def move_to(self, procs_fd: int) -> bool:
        """Move the zygote itself into the cgroup whose ``cgroup.procs`` is ``procs_fd`` (the
        caller's to close): a pool's, or the adopting job's. It is our child, pinned by a pidfd;
        alive after the write, the write moved it. False when it did not move."""
        try:
            return self._proc is not None and self._proc.move_to(procs_fd)
        except OSError as exc:
            _log.error("tracking.join_failed", job=self.job, pid=self.pid, rank="zygote", error=str(exc))
            return False

    def rss(self) -> int | None:
        """Its resident memory (bytes); our unreaped child, so the pid is its own."""
        return self._proc.rss() if self._proc is not None and self.usable else None

    def adopt(self, job_id: str) -> None:
        """Serve ``job_id`` from now on: a parked zygote taken by another job of the same setup."""
        self.job = job_id

    def on_lost(self, callback: Callable[[Zygote], None] | None) -> None:
        """Called (once) when the zygote is lost: dead, or no longer to be trusted."""
        self._on_lost = callback

    # -- forks ------------------------------------------------------------------------------------
    async def fork(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        """Fork one worker; its pid and exit future. Raises ``ZygoteError`` when it was not forked."""
        if not self.usable or self._proc is None or self._children is None:
            raise ZygoteError(f"zygote {self.state.value}")
        rid = self._pending.rid()
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        names, fds = ["log", "go"], [launch.log_fd, go_r]
        if launch.progress_fd is not None:
            names.append("progress")
            fds.append(launch.progress_fd)
        request = {
            "op": "fork",
            "id": rid,
            "argv": list(launch.argv),
            "env": launch.env,
            "cwd": launch.cwd,
            "fds": names,
            "progress_fd": launch.progress_fd,
            "mems": sorted(launch.mems) if launch.mems else None,  # set by the child itself, after its go
        }
        try:
            pid = await self._request(rid, request, fds)
            exited = self._adopt(pid)
            self._children.place(pid, procs_fd, launch.cpus)
            with contextlib.suppress(OSError):  # EPIPE: it has ended already (its exit follows)
                os.write(go_w, b"1")
        finally:
            os.close(go_r)
            os.close(go_w)  # before "1": the child ends itself (SPAWN_FAILED)
        return pid, exited

    async def fork_store(self, host: str, port: int, sock_fd: int) -> tuple[int, asyncio.Future[int]]:
        """Fork the job's store host (``zygote_program.storehost``), its control socket ``sock_fd``
        (the caller's to close): its pid and exit future. It stays in the zygote's cgroup leaf, and
        the group sweeps spare it (``helpers``). Raises ``ZygoteError`` when it was not forked."""
        if not self.usable or self._children is None:
            raise ZygoteError(f"zygote {self.state.value}")
        rid = self._pending.rid()
        request = {"op": "store", "id": rid, "host": host, "port": port, "fds": ["ctl"]}
        pid = await self._request(rid, request, [sock_fd])
        exited = self._adopt(pid)
        self.helpers.add(pid)
        exited.add_done_callback(lambda _: self.helpers.discard(pid))
        return pid, exited

    async def _request(self, rid: int, request: dict[str, object], fds: list[int]) -> int:
        assert self._loop is not None
        reply: asyncio.Future[Forked | ForkFailed] = self._loop.create_future()
        self._pending.forks[rid] = reply
        try:
            self._send(request, fds)
        except ZygoteError:
            self._pending.forks.pop(rid, None)
            raise
        try:
            answer = await asyncio.wait_for(asyncio.shield(reply), FORK_TIMEOUT_S)
        except TimeoutError:
            self._pending.forks.pop(rid, None)
            self._gone(f"no answer to a fork request within {FORK_TIMEOUT_S:g} s")
            raise ZygoteError("the zygote did not answer") from None
        if isinstance(answer, ForkFailed):
            raise ZygoteError(f"the zygote could not fork: {answer.error}")
        return answer.pid

    def _adopt(self, pid: int) -> asyncio.Future[int]:
        assert self._children is not None
        try:
            exited, wrong = self._children.adopt(pid, self.pid)
        except Bogus as exc:
            self._gone(str(exc))
            raise
        if wrong is not None:  # of an exit reported before the adoption
            self._nonsense(wrong)
        return exited

    # -- the end ----------------------------------------------------------------------------------
    def _died(self) -> None:
        status = self._proc.status() if self._proc is not None else None
        self._gone(f"exited with status {status}")

    def _gone(self, reason: str) -> None:
        """The zygote died or cannot be trusted: kill it and its running workers (their exits are
        unknown: they count as killed)."""
        if self.state is ZygoteState.STARTING:
            self._unavailable(reason)
            return
        if self.state is not ZygoteState.READY:
            return
        self.state, self.reason = ZygoteState.LOST, reason
        workers = self._children.pids() if self._children is not None else []
        _log.warning("zygote.lost", job=self.job, pid=self.pid, reason=reason, workers=workers)
        self._shut()
        if self._children is not None:
            self._children.orphaned(kill=True)
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback(self)

    def _shut(self) -> None:
        """Stop listening and kill the process, reaped off the event loop (``ZygoteProcess.shut``);
        every request still waiting fails."""
        if self._proc is not None:
            self._proc.shut()
        self._pending.fail_all()

    async def close(self) -> None:
        """Stop the zygote (its workers were stopped before)."""
        if self.state in (ZygoteState.STARTING, ZygoteState.READY):
            self.state = ZygoteState.CLOSED
            self._on_lost = None
            self._shut()
            if self._children is not None:
                self._children.orphaned(kill=False)
            _log.info("zygote.closed", job=self.job, pid=self.pid)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)
        if self._proc is not None:
            await self._proc.reaped()
