"""The daemon's side of a job's zygote: a warm parent that forks the job's workers.

A worker's start is mostly its interpreter's start and ``import torch``. The zygote does that once
per job and node (``zygote_boot`` is its program); each attempt's workers are forked from it, so a
restart costs a fork instead of an import. It is spawned exactly as a worker is (the submitter's
identity, cwd, environment, the job's tracking cgroup, a parent-death signal tied to the daemon),
with the job's own interpreter.

Everything the zygote says is untrusted: it runs the user's interpreter and imports the user's
modules. So the daemon
- accepts a pid only for a fork it asked for, and only while that pid is a child of the zygote
  (``/proc/<pid>/stat``, read after a pidfd pins the process); from then on it holds a pidfd,
  which names that process and no other, whatever happens to the pid;
- believes an exit status only once the pidfd says the process has ended, and when the report
  does not come (``EXIT_REPORT_S``), or the zygote is gone, counts the worker as killed;
- bounds every message, and gives up on a zygote that says too much nonsense (``zygote.lost``).

States (``ZygoteState``): STARTING → READY when its ``ready`` message came, → UNAVAILABLE when it
could not start (import error, threads, CUDA, timeout: workers are spawned cold, with a
``zygote.unavailable`` line); READY → LOST when it died or misbehaved (its running workers are
killed and count as failed; later workers are spawned cold, ``zygote.lost``); any → CLOSED when
the job ends on this node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from enum import Enum
from importlib import resources

from elasticd import log
from elasticd.workers.group import Launch, Spawner, before_drop
from elasticd.workers.reaper import Reaper
from elasticd.workers.spawn import Identity, worker_preexec
from elasticd.workers.zygote_wire import (
    MAX_MESSAGE,
    Exited,
    Forked,
    ForkFailed,
    Message,
    Ready,
    Unavailable,
    parse_message,
)

_log = log.get("elasticd.zygote")

READY_TIMEOUT_S = 60.0  # importing torch on a loaded node can take a while; longer means no zygote
FORK_TIMEOUT_S = 30.0  # for the zygote's reply to one fork request (milliseconds, unless the node is swamped)
EXIT_REPORT_S = 30.0  # for the exit status of a worker the kernel says has ended (idem)
MAX_BOGUS = 100  # nonsense messages before the zygote is given up
SNDBUF = 4 << 20  # a fork request carries one rank's argv and env
BOOT_FILE = "<elasticd-zygote>"
LOADER = (
    "import os;exec(compile(b''.join(iter(lambda:os.read({src},65536),b'')),'" + BOOT_FILE + "','exec'),"
    "{{'__name__':'__elasticd_zygote__','CTL_FD':{ctl}}})"
)


class ZygoteState(Enum):
    STARTING = "starting"
    READY = "ready"
    UNAVAILABLE = "unavailable"
    LOST = "lost"
    CLOSED = "closed"


class ZygoteError(Exception):
    """A fork through the zygote did not happen (the caller spawns that worker cold)."""


@dataclass(frozen=True)
class ZygoteSetup:
    job_id: str
    python: str
    kind: str  # "script" or "module"
    entry: str
    cwd: str
    env: dict[str, str]
    identity: Identity | None
    preload: tuple[str, ...] = ()
    torch: bool = True  # import torch too, when the interpreter has it

    def config(self) -> bytes:
        return json.dumps(
            {"kind": self.kind, "entry": self.entry, "preload": list(self.preload), "torch": self.torch}
        ).encode()


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None when it is gone), from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # "pid (comm) state ppid ...": comm may hold anything, so split after its last ')'
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (ValueError, IndexError):
        return None


def _ended(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has ended (a pidfd polls readable then)."""
    import select

    return bool(select.select([pidfd], [], [], 0)[0])


def boot_source() -> bytes:
    return resources.files("elasticd.workers").joinpath("zygote_boot.py").read_bytes()


# --- the process -------------------------------------------------------------------------------------


class _Child:
    def __init__(self, pid: int, pidfd: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.exited = exited
        self.timer: asyncio.TimerHandle | None = None


class Zygote:
    """One job's zygote on this node. Methods run on the event-loop thread."""

    def __init__(
        self, setup: ZygoteSetup, reaper: Reaper, procs_fd: int | None = None, source: bytes | None = None
    ) -> None:
        """``procs_fd``: the job's tracking cgroup leaf for the zygote (``JobTracking.join_zygote``);
        the zygote joins it, so it dies with the job's cgroup. ``source``: the program (tests pass
        fake zygotes); ``zygote_boot``'s by default."""
        self.setup = setup
        self.state = ZygoteState.STARTING
        self.reason = ""
        self.pid: int | None = None
        self._reaper = reaper
        self._procs_fd = procs_fd
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[bool] | None = None
        self._forks: dict[int, asyncio.Future[Forked | ForkFailed]] = {}
        self._children: dict[int, _Child] = {}
        self._next_id = 0
        self._bogus = 0
        self._started = 0.0
        self._reaping: asyncio.Future[int] | None = None
        self._source = source

    # -- start -----------------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the process (its imports run on while the caller goes on); see ``ready``."""
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._started = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        src_r, src_w = os.pipe2(os.O_CLOEXEC)
        try:
            source = self._source if self._source is not None else boot_source()
            if len(source) >= 65536:  # written whole before the child reads: must fit the pipe
                raise ZygoteError("bootstrap larger than a pipe's buffer")
            os.write(src_w, source)
            os.close(src_w)
            src_w = -1
            with contextlib.suppress(OSError):
                force: int | None = getattr(socket, "SO_SNDBUFFORCE", None) if os.geteuid() == 0 else None
                ours.setsockopt(socket.SOL_SOCKET, force or socket.SO_SNDBUF, SNDBUF)
            s = self.setup
            self._proc = subprocess.Popen(
                [s.python, "-u", "-c", LOADER.format(src=src_r, ctl=theirs.fileno()), "elasticd-zygote"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=s.env,
                start_new_session=True,
                preexec_fn=worker_preexec(s.cwd, s.identity, before_drop(self._procs_fd, None)),
                close_fds=True,
                pass_fds=(src_r, theirs.fileno()),
            )
            self.pid = self._proc.pid
            self._pidfd = os.pidfd_open(self.pid)
            ours.setblocking(False)
            ours.send(s.config())
        except (OSError, subprocess.SubprocessError, ZygoteError) as exc:
            ours.close()
            self._unavailable(f"cannot start: {exc}")
            return
        finally:
            theirs.close()
            os.close(src_r)
            if src_w >= 0:
                os.close(src_w)
            if self._procs_fd is not None:
                os.close(self._procs_fd)
                self._procs_fd = None
        self._sock = ours
        self._reaper.track(self.pid)
        self._loop.add_reader(ours.fileno(), self._readable)
        self._loop.add_reader(self._pidfd, self._died)
        self._loop.call_later(READY_TIMEOUT_S, self._ready_timeout)
        _log.info("zygote.spawned", job=s.job_id, pid=self.pid, python=s.python)

    async def ready(self) -> bool:
        """Wait until the zygote is READY (True) or will not be (False)."""
        if self._ready is None:
            return False
        return await asyncio.shield(self._ready) and self.usable

    @property
    def usable(self) -> bool:
        return self.state is ZygoteState.READY

    def _ready_timeout(self) -> None:
        if self.state is ZygoteState.STARTING:
            self._unavailable(f"not ready within {READY_TIMEOUT_S:g} s")

    def _unavailable(self, reason: str) -> None:
        if self.state is not ZygoteState.STARTING:
            return
        self.state, self.reason = ZygoteState.UNAVAILABLE, reason
        _log.warning("zygote.unavailable", job=self.setup.job_id, pid=self.pid, reason=reason)
        self._shut()
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)

    # -- messages ---------------------------------------------------------------------------------
    def _readable(self) -> None:
        for _ in range(64):  # a bounded share of the loop per wake-up
            if self._sock is None:
                return
            try:
                data, _, flags, _ = self._sock.recvmsg(MAX_MESSAGE + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._gone(f"control socket: {exc}")
                return
            if not data:
                self._gone("closed its control socket")
                return
            try:
                if flags & socket.MSG_TRUNC:
                    raise ValueError("message too long")
                msg = parse_message(data)
            except ValueError as exc:
                self._nonsense(f"{exc}: {data[:80]!r}")
                continue
            self._handle(msg)

    def _nonsense(self, what: str) -> None:
        self._bogus += 1
        _log.warning("zygote.bogus", job=self.setup.job_id, pid=self.pid, message=what)
        if self._bogus >= MAX_BOGUS:
            self._gone("too many bogus messages")

    def _handle(self, msg: Message) -> None:
        match msg:
            case Ready() if self.state is ZygoteState.STARTING:
                if msg.pid != self.pid:
                    self._unavailable(f"said its pid is {msg.pid}")
                    return
                self.state = ZygoteState.READY
                _log.info(
                    "zygote.ready",
                    job=self.setup.job_id,
                    pid=self.pid,
                    import_s=msg.import_s,
                    ready_s=round(time.monotonic() - self._started, 4),
                    torch=msg.torch,
                )
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(True)
            case Unavailable() if self.state is ZygoteState.STARTING:
                self._unavailable(msg.reason)
            case Forked() | ForkFailed() if msg.id in self._forks:
                fut = self._forks.pop(msg.id)
                if not fut.done():
                    fut.set_result(msg)
            case Exited() if msg.pid in self._children:
                self._reported(self._children[msg.pid], msg.status)
            case _:
                self._nonsense(f"unexpected {msg}")

    # -- forks ------------------------------------------------------------------------------------
    async def fork(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        """Fork one worker; its pid and exit future. Raises ``ZygoteError`` when it was not forked."""
        if not self.usable or self._sock is None or self._loop is None:
            raise ZygoteError(f"zygote {self.state.value}")
        rid = self._next_id
        self._next_id += 1
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        names, fds = ["log", "go"], [launch.log_fd, go_r]
        if launch.progress_fd is not None:
            names.append("progress")
            fds.append(launch.progress_fd)
        try:
            pid = await self._request(rid, launch, names, fds)
            exited = self._adopt(pid)
            self._place(self._children.get(pid), procs_fd)
            with contextlib.suppress(OSError):  # EPIPE: it has ended already (its exit follows)
                os.write(go_w, b"1")
        finally:
            os.close(go_r)
            os.close(go_w)  # before "1": the child ends itself (SPAWN_FAILED)
        return pid, exited

    async def _request(self, rid: int, launch: Launch, names: list[str], fds: list[int]) -> int:
        assert self._sock is not None and self._loop is not None
        request = {
            "op": "fork",
            "id": rid,
            "argv": list(launch.argv),
            "env": launch.env,
            "cwd": launch.cwd,
            "fds": names,
            "progress_fd": launch.progress_fd,
        }
        reply: asyncio.Future[Forked | ForkFailed] = self._loop.create_future()
        self._forks[rid] = reply
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
        except OSError as exc:  # EMSGSIZE: an environment too large for one message; EAGAIN: stuck
            self._forks.pop(rid, None)
            raise ZygoteError(f"cannot send the fork request: {exc}") from exc
        try:
            answer = await asyncio.wait_for(asyncio.shield(reply), FORK_TIMEOUT_S)
        except TimeoutError:
            self._forks.pop(rid, None)
            self._gone(f"no answer to a fork request within {FORK_TIMEOUT_S:g} s")
            raise ZygoteError("the zygote did not answer") from None
        if isinstance(answer, ForkFailed):
            raise ZygoteError(f"the zygote could not fork: {answer.error}")
        return answer.pid

    def _place(self, child: _Child | None, procs_fd: int | None) -> None:
        """Move the new worker into its rank's tracking cgroup while it waits for its go.

        The daemon writes the pid itself: a ``cgroup.procs`` fd opened by root would let whoever
        holds it move *any* process there (the kernel checks the opener's credentials), so it is
        never handed to the zygote. The pid is the zygote's child, pinned by a pidfd: alive
        before and after the write, it is the process the write moved."""
        if procs_fd is None or child is None or child.pidfd < 0 or _ended(child.pidfd):
            return
        try:
            os.write(procs_fd, str(child.pid).encode())
        except OSError as exc:  # it ended meanwhile, or the leaf is gone: it runs in the zygote's
            _log.error("tracking.join_failed", job=self.setup.job_id, pid=child.pid, error=str(exc))
        if _ended(child.pidfd):  # it ended during the write: in theory its pid named another process
            _log.error("zygote.placement_raced", job=self.setup.job_id, pid=child.pid)

    def _adopt(self, pid: int) -> asyncio.Future[int]:
        """Pin the reported pid with a pidfd and check it is the zygote's child, or give up on it."""
        assert self._loop is not None
        if pid in self._children:
            self._gone(f"reported pid {pid} twice")
            raise ZygoteError("bogus pid")
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # ended and reaped already: its exit report follows
            pidfd = -1
        except OSError as exc:
            self._gone(f"pidfd_open({pid}): {exc}")
            raise ZygoteError("bogus pid") from exc
        if pidfd >= 0 and parent_of(pid) not in (self.pid, None):
            os.close(pidfd)
            self._gone(f"reported pid {pid}, which is not its child")
            raise ZygoteError("bogus pid")
        exited: asyncio.Future[int] = self._loop.create_future()
        child = _Child(pid, pidfd, exited)
        self._children[pid] = child
        if pidfd >= 0:
            self._loop.add_reader(pidfd, self._ended, child)
        else:
            self._ended(child)
        return exited

    def _ended(self, child: _Child) -> None:
        """The kernel says the worker has ended; its status is the zygote's to report."""
        if child.pidfd >= 0 and self._loop is not None:
            self._loop.remove_reader(child.pidfd)
        if self.state is not ZygoteState.READY:
            self._resolve(child, -signal.SIGKILL, "zygote gone")
        elif child.timer is None and self._loop is not None:
            child.timer = self._loop.call_later(
                EXIT_REPORT_S, self._resolve, child, -signal.SIGKILL, "exit not reported"
            )

    def _reported(self, child: _Child, status: int) -> None:
        if child.pidfd >= 0 and not _ended(child.pidfd):
            self._nonsense(f"reported pid {child.pid} exited while it runs")
            return
        try:
            code = os.waitstatus_to_exitcode(status)
        except ValueError:
            self._nonsense(f"status {status} of pid {child.pid}")
            return
        self._resolve(child, code)

    def _resolve(self, child: _Child, code: int, why: str = "") -> None:
        if why:
            _log.warning("zygote.exit_unknown", job=self.setup.job_id, pid=child.pid, why=why)
        if child.timer is not None:
            child.timer.cancel()
        if child.pidfd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(child.pidfd)
            os.close(child.pidfd)
            child.pidfd = -1
        self._children.pop(child.pid, None)
        if not child.exited.done():
            child.exited.set_result(code)

    # -- the end ----------------------------------------------------------------------------------
    def _died(self) -> None:
        status = self._proc.wait() if self._proc is not None else None
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
        _log.warning(
            "zygote.lost", job=self.setup.job_id, pid=self.pid, reason=reason, workers=sorted(self._children)
        )
        self._shut()
        for child in list(self._children.values()):
            if child.pidfd >= 0:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            self._ended(child)

    def _shut(self) -> None:
        """Stop listening and kill the process. It is our child, so its pid cannot be reused
        before it is reaped, which a thread does (Popen.wait), off the event loop."""
        if self._loop is not None:
            if self._sock is not None:
                self._loop.remove_reader(self._sock.fileno())
            if self._pidfd is not None:
                self._loop.remove_reader(self._pidfd)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        for fut in self._forks.values():
            if not fut.done():
                fut.set_result(ForkFailed(-1, "zygote gone"))
        self._forks.clear()
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            self._reaper.untrack(proc.pid)
            self._reaping = asyncio.ensure_future(asyncio.to_thread(proc.wait))

    async def close(self) -> None:
        """The job ended on this node: stop the zygote (its workers were stopped before)."""
        if self.state in (ZygoteState.STARTING, ZygoteState.READY):
            self.state = ZygoteState.CLOSED
            self._shut()
            for child in list(self._children.values()):
                self._ended(child)
            _log.info("zygote.closed", job=self.setup.job_id, pid=self.pid)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)
        if self._reaping is not None:
            with contextlib.suppress(Exception):
                await self._reaping


class WarmSpawner:
    """Workers forked from the job's zygote while it is usable; cold otherwise, and for any fork it
    does not carry out (``elasticd.workers.group.Spawner``)."""

    def __init__(self, zygote: Zygote, cold: Spawner) -> None:
        self._zygote = zygote
        self._cold = cold

    @property
    def mode(self) -> str:
        return "warm" if self._zygote.usable else "cold"

    async def spawn(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        if self._zygote.usable:
            try:
                return await self._zygote.fork(launch, procs_fd)
            except ZygoteError as exc:
                _log.warning(
                    "zygote.fork_failed", job=self._zygote.setup.job_id, rank=launch.rank, error=str(exc)
                )
        return await self._cold.spawn(launch, procs_fd)

    def spared(self) -> frozenset[int]:
        z = self._zygote
        return frozenset({z.pid}) if z.pid is not None and z.state is ZygoteState.READY else frozenset()
