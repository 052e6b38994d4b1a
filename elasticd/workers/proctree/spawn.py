"""Low-level process creation shared by workers, the embedded etcd and the reaper sidecar.

Children get ``PR_SET_PDEATHSIG=SIGKILL``: when the daemon dies, even by SIGKILL, the kernel kills
them. The signal is tied to the *thread* that forked, so callers spawn from the event-loop thread,
which lives as long as the daemon. The ``preexec_fn`` runs between fork and exec, after any uid
change (a uid change would clear the setting), and only calls a pre-resolved libc function.

Workers switch to the submitter's identity in their own ``preexec_fn`` instead of through Popen's
``user=``/``cwd=``: CPython enters ``cwd`` *before* it drops privileges, so a job could make a root
process chdir into a directory only root may enter. Here the order is: the root-only hook, the
identity switch, then ``chdir`` with the user's own permissions.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from elasticd.workers.zygote_program.shared import PARENT_GONE, SPAWN_FAILED

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_PR_SET_PDEATHSIG = 1
# What a service manager hands the daemon and must not reach its children: a child that sent
# READY=1 on the daemon's notify socket would speak for the daemon.
_DAEMON_ONLY_ENV = (
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
)


@dataclass(frozen=True)
class Identity:
    """Who a worker runs as, when the daemon (root) must switch to the submitter."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child die with this process.

    The parent's pid is taken now, before the fork: if the parent died before ``prctl`` took
    effect, the child's parent pid differs (this also works when the daemon is pid 1).
    """
    parent = os.getpid()

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(PARENT_GONE)

    return preexec


def _fail(message: str) -> NoReturn:
    """End the child before exec, leaving the reason in its log (fd 2 is the log by now)."""
    with contextlib.suppress(OSError):
        os.write(2, message.encode(errors="replace"))
    os._exit(SPAWN_FAILED)


def worker_preexec(
    cwd: str, identity: Identity | None, before_drop: Callable[[], None] | None = None
) -> Callable[[], None]:
    """A ``preexec_fn`` for a worker: ``before_drop`` as root, switch identity, enter ``cwd`` as
    the user, then the parent-death signal (after the switch, which would clear it).

    Any failure ends the child with ``SPAWN_FAILED`` and a line in its log: it must never go on to
    exec as root, nor in a directory the user could not have entered.
    """
    parent = os.getpid()

    def preexec() -> None:
        if before_drop is not None:
            try:
                before_drop()
            except Exception as exc:
                _fail(f"elasticd: cannot prepare the worker: {exc}\n")
        if identity is not None:
            try:
                os.setgroups(list(identity.groups))
                os.setresgid(identity.gid, identity.gid, identity.gid)
                os.setresuid(identity.uid, identity.uid, identity.uid)
            except OSError as exc:
                _fail(f"elasticd: cannot switch to uid {identity.uid}: {exc.strerror}\n")
        try:
            os.chdir(cwd)
        except OSError as exc:
            _fail(f"elasticd: cannot enter working directory {cwd}: {exc.strerror}\n")
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(PARENT_GONE)

    return preexec


def child_env() -> dict[str, str]:
    """The daemon's environment minus what belongs to the daemon alone (for etcd and the reaper)."""
    return {k: v for k, v in os.environ.items() if k not in _DAEMON_ONLY_ENV}
