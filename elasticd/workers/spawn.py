"""Low-level process creation shared by workers, the embedded etcd and the reaper sidecar.

Children get ``PR_SET_PDEATHSIG=SIGKILL``: when the daemon dies, even by SIGKILL, the kernel kills
them. The signal is tied to the *thread* that forked, so callers spawn from the event-loop thread,
which lives as long as the daemon. ``die_with_parent`` runs between fork and exec, after any uid
change (a uid change would clear the setting), and only calls a pre-resolved libc function.
"""

from __future__ import annotations

import ctypes
import os
import signal

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(70)
