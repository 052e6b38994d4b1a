"""The host's memory as the snapshot bound needs it: ``/proc/meminfo`` and a ``statvfs`` of
``/dev/shm``. The one place that reads them; what they mean is decided in ``node/snapshotbound.py``.

Nothing here opens a path a user could write: ``/proc/meminfo`` is the kernel's, and ``statvfs``
opens nothing (``/dev/shm`` itself is root's, only its contents are the users').
"""

from __future__ import annotations

import os

from elasticd.node.snapshotbound import HostMemory, parse_meminfo

MEMINFO = "/proc/meminfo"
SHM = "/dev/shm"


def shm_bytes(path: str = SHM) -> int | None:
    """The size of the tmpfs at ``path`` (None: none there)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def read(meminfo: str = MEMINFO, shm: str = SHM) -> HostMemory:
    """RAM, and ``/dev/shm``'s size and free space (None for what could not be read)."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as f:
            total = parse_meminfo(f.read(64 * 1024))
    except OSError:
        total = None
    try:
        st = os.statvfs(shm)
    except OSError:
        return HostMemory(total, None, None)
    return HostMemory(total, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
