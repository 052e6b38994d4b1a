"""Whether this node can hold a job's memory snapshots: refused at submit when it cannot.

A job's snapshot keeper (``workers.warm.keeper``) keeps its segments in memfds, which no
``/dev/shm`` size limits; where ``memfd_create`` is refused (an old kernel, a container's seccomp
profile) it falls back to unlinked files in ``/dev/shm``, and a write past a tmpfs's size is a
SIGBUS in the training loop (Docker's default ``/dev/shm`` is 64 MB). So the node refuses, at
submit, a job it could not keep snapshots for whichever way, with a code a script can match.
"""

from __future__ import annotations

import os

from elasticd.errors import SnapshotSpace

SHM = "/dev/shm"


def shm_bytes(path: str = SHM) -> int | None:
    """The size of the tmpfs at ``path`` (None: none there). A ``statvfs``: nothing is opened."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def refusal(bound: int, shm: int | None, node: str) -> SnapshotSpace | None:
    """Why a job that may snapshot ``bound`` bytes on ``node`` is refused (None: it is not)."""
    if bound <= 0 or (shm is not None and shm >= bound):
        return None
    have = "no /dev/shm" if shm is None else f"a /dev/shm of {shm} bytes"
    return SnapshotSpace(
        f"node {node} has {have}, less than its memory snapshot bound of {bound} bytes (setting"
        " snapshot_bytes): enlarge /dev/shm (docker run --shm-size) or lower snapshot_bytes",
        shm_bytes=shm,
        bound=bound,
        setting="snapshot_bytes",
    )
