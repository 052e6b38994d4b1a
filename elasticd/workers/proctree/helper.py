"""The long-lived helper processes the daemon starts: one launch path and one stop policy.

A helper lives beside a job's workers (the zygote, ``warm.zygote``; the snapshot keeper,
``warm.snapshotkeeper``) or beside the daemon (the reaper, ``proctree.reaper``). Every helper:

- **starts** as a session leader with a parent-death signal tied to the daemon's thread. A job's
  helper (``launch``) runs as the submitter, as a worker is spawned (``spawn.worker_preexec``: its
  tracking cgroup leaf joined first, then the submitter's identity, then its cwd), in the job's own
  interpreter, and its program is stdlib-only source the daemon hands over a pipe (``Program``):
  the loader makes the program's namespace a module registered under its name (so dataclasses and
  enums work in it) and runs each part there, in order. Its control socket is a
  ``SOCK_SEQPACKET`` pair; our end's first message is its configuration.
- **is watched** as a worker is: its exit is a future (``exit_future``), set from its pidfd by
  the event loop, with no thread and no polling.
- **is never restarted.** A helper that dies takes what it held with it, and its owner falls back
  at once: a lost zygote's workers are spawned cold, a lost keeper's workers checkpoint to disk, a
  lost reaper's duties end with the daemon (whose death the kernel signals to every child).
- **stops** by one policy (``StopPolicy``, ``stop``): its owner asks first (it closes or shuts its
  end of the control channel: the helper's EOF), then ``stop`` waits up to the helper's grace, then
  SIGKILLs it (its whole process group where it has children of its own there) and reaps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from elasticd.workers.proctree.markers import JOB_ENV
from elasticd.workers.proctree.spawn import Identity, worker_preexec

# The program is written whole before the child reads: it must fit the pipe, grown to this from
# the kernel's default of 64 KiB (within the default fs.pipe-max-size of 1 MiB).
PIPE_BYTES = 256 * 1024


class HelperError(OSError):
    """A helper could not be started."""


@dataclass(frozen=True)
class Program:
    """A helper's stdlib-only program: its parts (files of ``package``, run in this order in one
    namespace), the namespace's ``__name__`` (its parts' guards compare with it), the file name
    its parts are compiled under (tracebacks name it), and the title ``ps`` shows."""

    package: str
    parts: tuple[str, ...]
    name: str
    filename: str
    title: str

    def source(self) -> bytes:
        """The parts, NUL-separated (no Python source holds a NUL)."""
        files = resources.files(self.package)
        return b"\0".join(files.joinpath(part).read_bytes() for part in self.parts)

    def loader(self, src: int, ctl: int) -> str:
        """The ``-c`` program: reads the parts from fd ``src`` and runs each in the program's
        module, whose ``CTL_FD`` is the helper's end of its control socket."""
        return (
            f"import os,sys,types;m=types.ModuleType('{self.name}');sys.modules['{self.name}']=m;"
            f"g=m.__dict__;g['CTL_FD']={ctl};"
            f"[exec(compile(p,'{self.filename}','exec'),g) for p in "
            f"b''.join(iter(lambda:os.read({src},65536),b'')).split(b'\\0')]"
        )


@dataclass(frozen=True)
class Seat:
    """Where and as whom a job's helper runs: the job's interpreter, cwd and environment (plus its
    own ``marker`` as ``ELASTICD_JOB``, which no sweep of the job's workers matches) and the
    submitter's identity (None: the daemon's own)."""

    python: str
    cwd: str
    env: dict[str, str]
    identity: Identity | None
    marker: str


@dataclass
class Started:
    """A helper just started: its ``Popen``, our end of its control socket (non-blocking), its pidfd."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    pidfd: int


def launch(
    seat: Seat,
    program: Program,
    config: bytes,
    procs_fd: int | None,
    *,
    source: bytes | None = None,
    sndbuf: int = 0,
) -> Started:
    """Start a job's helper and send it ``config``; its program runs on while the caller goes on.

    ``procs_fd`` (closed here, whatever happens): the tracking cgroup leaf it joins before it
    drops root. ``source``: the program's bytes (tests pass fake ones), ``program.source()`` by
    default. ``sndbuf``: the send buffer our end asks for (0: the default). Raises ``OSError``
    (``HelperError`` among them) or ``subprocess.SubprocessError``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    src_r, src_w = os.pipe2(os.O_CLOEXEC)
    try:
        code = source if source is not None else program.source()
        with contextlib.suppress(OSError):  # a lower fs.pipe-max-size: the length check below says so
            fcntl.fcntl(src_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        if len(code) >= fcntl.fcntl(src_w, fcntl.F_GETPIPE_SZ):
            raise HelperError(f"{program.title}'s program is larger than a pipe's buffer")
        os.write(src_w, code)
        os.close(src_w)
        src_w = -1
        if sndbuf:
            with contextlib.suppress(OSError):
                force: int | None = getattr(socket, "SO_SNDBUFFORCE", None) if os.geteuid() == 0 else None
                ours.setsockopt(socket.SOL_SOCKET, force or socket.SO_SNDBUF, sndbuf)
        proc = subprocess.Popen(
            [seat.python, "-u", "-c", program.loader(src_r, theirs.fileno()), program.title],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=seat.env | {JOB_ENV: seat.marker},
            start_new_session=True,
            preexec_fn=worker_preexec(seat.cwd, seat.identity, _joiner(procs_fd)),
            close_fds=True,
            pass_fds=(src_r, theirs.fileno()),
        )
        try:
            pidfd = os.pidfd_open(proc.pid)
            ours.setblocking(False)
            ours.send(config)
        except OSError:
            proc.kill()
            proc.wait()
            raise
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
    return Started(proc, ours, pidfd)


def _joiner(procs_fd: int | None) -> Callable[[], None] | None:
    """The child's root-only step: join its tracking cgroup leaf (a helper has no limits)."""
    if procs_fd is None:
        return None

    def join() -> None:
        os.write(procs_fd, b"0")

    return join


@dataclass(frozen=True)
class StopPolicy:
    """How a helper is stopped once its owner asked it to: ``grace_s`` to exit of its own accord
    (0: killed at once), then SIGKILL, to its process group when ``group`` (the helper's own
    children there, the keeper's writers, die with it) or to it alone (a zygote's workers are
    stopped by their group, never through it)."""

    grace_s: float
    group: bool


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], policy: StopPolicy) -> int:
    """Wait up to the grace, kill by the policy, reap; the exit status. Blocks: callers on the
    event loop run it in a thread. A process already gone is only reaped."""
    if policy.grace_s > 0:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(policy.grace_s)
    kill(proc, policy)
    return proc.wait()


def kill(proc: subprocess.Popen[bytes] | subprocess.Popen[str], policy: StopPolicy) -> None:
    """SIGKILL now, by the policy (its process group, or it alone); one already gone is left be."""
    with contextlib.suppress(OSError):
        if policy.group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()


def exit_future(proc: subprocess.Popen[bytes], pidfd: int | None = None) -> asyncio.Future[int]:
    """``proc``'s exit status (our child: the loop reaps it), on the running loop: read off
    ``pidfd`` (ours from here on) or one opened now; a thread waits where the kernel has no
    pidfd. Cancelling the future stops the watch (and closes the pidfd)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()
    if pidfd is None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:  # very old kernel: a thread waits instead
            task = loop.run_in_executor(None, proc.wait)
            task.add_done_callback(lambda t: None if fut.done() else fut.set_result(t.result()))
            return fut
    fd, watching = pidfd, [True]

    def unwatch(_: object = None) -> None:
        if watching:
            watching.clear()
            loop.remove_reader(fd)
            os.close(fd)

    def on_exit() -> None:
        unwatch()
        if not fut.done():
            fut.set_result(proc.wait())

    loop.add_reader(fd, on_exit)
    fut.add_done_callback(unwatch)
    return fut
