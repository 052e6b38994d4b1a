"""A bound worker's memory policy, the daemon's side: the call an exec'd worker makes in its
pre-exec step, and whether the kernel takes it at all.

Workers set the policy themselves (``zygote_program.mempolicy``), between fork and exec or in a
forked child, where no log reaches the daemon, and go on without it when refused. So the daemon
makes the same call once per kind of policy (one node, several), in a throwaway thread (the policy
is the thread's own), and logs a refusal then: once, not for every worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from elasticd import log
from elasticd.workers.zygote_program.mempolicy import prefer_nodes, preferred_mode

_log = log.get("elasticd.numa")
_tried: dict[int, int] = {}  # policy mode -> the errno the kernel gave (0: taken)
_lock = threading.Lock()


def checked(nodes: frozenset[int]) -> Callable[[], int]:
    """The call that makes the calling thread prefer ``nodes`` (0 or an errno), resolved now; the
    first time for its kind of policy it is tried here, and a refusal logged."""
    call = prefer_nodes(nodes)
    mode = preferred_mode(nodes)
    with _lock:
        if mode in _tried:
            return call
        _tried[mode] = -1
    got: list[int] = []
    probe = threading.Thread(target=lambda: got.append(call()), name="elasticd-mempolicy", daemon=True)
    probe.start()
    probe.join()
    errno = got[0] if got else -1
    _tried[mode] = errno
    if errno:
        _log.warning(
            "numa.mempolicy_refused",
            nodes=",".join(map(str, sorted(nodes))),
            errno=errno,
            error=os.strerror(errno) if errno > 0 else "the probe did not run",
            then="workers run with the default policy (pages on the node of the CPU that touches them)",
        )
    return call
