"""What a zygote is made of, and starting its process (the daemon's side; ``zygote`` supervises it).

A zygote is spawned exactly as a worker is (the submitter's identity, cwd, environment, the job's
tracking cgroup, a parent-death signal tied to the daemon), with the job's own interpreter running
the stdlib-only program of ``workers.zygote_program`` (``BOOT_PARTS``), handed over a pipe.

``ZygoteKey`` is everything that makes a zygote what it is: two jobs whose setups have the same key
would start identical zygotes, so a parked one may serve the second (``pool``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
from dataclasses import dataclass, field
from importlib import resources

from elasticd.workers.group import before_drop
from elasticd.workers.proctree.markers import JOB_ENV
from elasticd.workers.proctree.spawn import Identity, worker_preexec
from elasticd.workers.zygote_program.shared import BOOT_FILE, PROGRAM_NAME

SNDBUF = 4 << 20  # a fork request carries one rank's argv and env
PROGRAM = "elasticd.workers.zygote_program"
# Run in this order, in one namespace.
BOOT_PARTS = ("shared.py", "mempolicy.py", "title.py", "child.py", "storehost.py", "boot.py")
# Reads the parts (NUL-separated: no Python source holds a NUL) and runs each in the same globals.
LOADER = (
    "import os;g={{'__name__':'" + PROGRAM_NAME + "','CTL_FD':{ctl}}};"
    "[exec(compile(p,'" + BOOT_FILE + "','exec'),g) for p in "
    "b''.join(iter(lambda:os.read({src},65536),b'')).split(b'\\0')]"
)


class ZygoteError(Exception):
    """A zygote could not do what was asked (the caller spawns that worker cold, or a fresh zygote)."""


@dataclass(frozen=True)
class ZygoteKey:
    """What makes a zygote what it is. Only an exact match may adopt a parked one.

    Identity (the submitter and the uid/gid/groups it runs as), the interpreter's path, cwd, the
    entry point (``sys.path[0]`` and what a fork runs), the modules imported, and the whole
    environment it was started with except the per-job marker. The interpreter's and modules'
    *contents* are not part of the key: the zygote re-checks their files itself, as the user, when
    it is adopted (``Zygote.check``). Jobs with resource limits have no zygote, and rlimits and
    umask are the daemon's for every zygote; ``tracked`` says whether it lives in a cgroup.
    """

    uid: int  # the submitter (the pool's per-user bound counts these)
    identity: Identity | None
    python: str
    cwd: str
    kind: str
    entry: str
    preload: tuple[str, ...]
    torch: bool
    env: tuple[tuple[str, str], ...]  # sorted
    tracked: bool


@dataclass(frozen=True)
class ZygoteSetup:
    job_id: str
    python: str
    kind: str  # "script" or "module"
    entry: str
    cwd: str
    env: dict[str, str] = field(hash=False)
    identity: Identity | None
    preload: tuple[str, ...] = ()
    torch: bool = True  # import torch too, when the interpreter has it
    uid: int = -1  # the submitter's uid (the job spec's)

    def config(self) -> bytes:
        return json.dumps(
            {"kind": self.kind, "entry": self.entry, "preload": list(self.preload), "torch": self.torch}
        ).encode()

    def key(self, tracked: bool) -> ZygoteKey:
        env = tuple(sorted((k, v) for k, v in self.env.items() if k != JOB_ENV))
        return ZygoteKey(
            self.uid, self.identity, self.python, self.cwd, self.kind, self.entry, self.preload, self.torch,
            env, tracked,
        )  # fmt: skip


def new_marker() -> str:
    """The value of the zygote's ``ELASTICD_JOB``: its own, never a job id. Its forked workers keep
    it in ``/proc/<pid>/environ`` (what ``proctree.marked`` reads) where the kernel refuses them
    their own environment block (``zygote_program.title``), so the groups it forks sweep for it
    too; unique, so no other job's sweep can ever match it."""
    return f"zygote-{secrets.token_hex(8)}"


def boot_source() -> bytes:
    files = resources.files(PROGRAM)
    return b"\0".join(files.joinpath(name).read_bytes() for name in BOOT_PARTS)


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


def ended(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has ended (a pidfd polls readable then)."""
    import select

    return bool(select.select([pidfd], [], [], 0)[0])


@dataclass
class Started:
    """A zygote process just started: its ``Popen``, our end of its control socket, its pidfd."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    pidfd: int


def start(setup: ZygoteSetup, marker: str, procs_fd: int | None, source: bytes | None = None) -> Started:
    """Start the process and send its configuration; its imports run on while the caller goes on.

    ``procs_fd`` (closed here, whatever happens): the tracking cgroup leaf the child joins before it
    drops root. ``source``: the program (tests pass fake zygotes). Raises ``OSError``,
    ``subprocess.SubprocessError`` or ``ZygoteError``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    src_r, src_w = os.pipe2(os.O_CLOEXEC)
    try:
        program = source if source is not None else boot_source()
        if len(program) >= 65536:  # written whole before the child reads: must fit the pipe
            raise ZygoteError("bootstrap larger than a pipe's buffer")
        os.write(src_w, program)
        os.close(src_w)
        src_w = -1
        with contextlib.suppress(OSError):
            force: int | None = getattr(socket, "SO_SNDBUFFORCE", None) if os.geteuid() == 0 else None
            ours.setsockopt(socket.SOL_SOCKET, force or socket.SO_SNDBUF, SNDBUF)
        proc = subprocess.Popen(
            [setup.python, "-u", "-c", LOADER.format(src=src_r, ctl=theirs.fileno()), "elasticd-zygote"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=setup.env | {JOB_ENV: marker},
            start_new_session=True,
            preexec_fn=worker_preexec(setup.cwd, setup.identity, before_drop(procs_fd, None)),
            close_fds=True,
            pass_fds=(src_r, theirs.fileno()),
        )
        try:
            pidfd = os.pidfd_open(proc.pid)
            ours.setblocking(False)
            ours.send(setup.config())
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
