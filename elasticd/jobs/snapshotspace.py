"""Whether this node can hold a job's memory snapshots: refused at submit when it cannot.

A job's snapshot keeper (``workers.warm.snapshotkeeper``) keeps its segments in memfds, which no
``/dev/shm`` size limits; where ``memfd_create`` is refused (an old kernel, a container's seccomp
profile) it falls back to unlinked files in ``/dev/shm``, and a write past a tmpfs's size is a
SIGBUS in the training loop (Docker's default ``/dev/shm`` is 64 MB). So the node refuses, at
submit, a job it could not keep snapshots for whichever way, with a code a script can match. A
bound the node derived never asks for more than ``/dev/shm`` had (``node/snapshotbound.py``); an
operator's can. Pure: ``/dev/shm``'s size comes in (``node/hostmemory.py``: ``shm_bytes``).
"""

from __future__ import annotations

from elasticd.errors import SnapshotSpace


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
