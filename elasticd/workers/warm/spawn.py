"""What a zygote is made of (the daemon's side; ``zygote`` supervises it).

A zygote is a helper process (``proctree.helper``: started as a worker is, as the submitter, in
the job's tracking cgroup, tied to the daemon): the job's own interpreter runs the stdlib-only
program of ``workers.zygote_program`` (``ZYGOTE``); it is never restarted, and it is killed at
once when it stops (``ZYGOTE_STOP``: its workers are stopped by their group, never through it).

``ZygoteKey`` is everything that makes a zygote what it is: two jobs whose setups have the same key
would start identical zygotes, so a parked one may serve the second (``pool``).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from elasticd.workers.proctree.helper import Program, Seat, StopPolicy
from elasticd.workers.proctree.markers import JOB_ENV
from elasticd.workers.proctree.spawn import Identity
from elasticd.workers.zygote_program.shared import BOOT_FILE, PROGRAM_NAME

SNDBUF = 4 << 20  # a fork request carries one rank's argv and env
PROGRAM = "elasticd.workers.zygote_program"
# Run in this order, in one namespace.
BOOT_PARTS = (
    "shared.py", "mempolicy.py", "title.py", "child.py", "storehost.py", "stamps.py", "reach.py", "boot.py",
)  # fmt: skip
ZYGOTE = Program(PROGRAM, BOOT_PARTS, PROGRAM_NAME, BOOT_FILE, "elasticd-zygote")
ZYGOTE_STOP = StopPolicy(grace_s=0.0, group=False)


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

    def seat(self, marker: str) -> Seat:
        return Seat(self.python, self.cwd, self.env, self.identity, marker)

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
