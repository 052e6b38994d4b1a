"""Low-level process creation shared by workers, the embedded etcd and the reaper sidecar.

Children get ``PR_SET_PDEATHSIG=SIGKILL``: when the daemon dies, even by SIGKILL, the kernel kills
them. The signal is tied to the *thread* that forked, so callers spawn from the event-loop thread,
which lives as long as the daemon. The ``preexec_fn`` runs between fork and exec, after any uid
change (a uid change would clear the setting), and only calls a pre-resolved libc function.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

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


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child die with this process.

    The parent's pid is taken now, before the fork: if the parent died before ``prctl`` took
    effect, the child's parent pid differs (this also works when the daemon is pid 1).
    """
    parent = os.getpid()

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(70)

    return preexec


def child_env() -> dict[str, str]:
    """The daemon's environment minus what belongs to the daemon alone (for etcd and the reaper)."""
    return {k: v for k, v in os.environ.items() if k not in _DAEMON_ONLY_ENV}
