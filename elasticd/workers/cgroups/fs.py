"""The cgroupfs seam at the bottom of ``cgroups``: the operations every other module here makes.

Every filesystem call on a cgroup goes through ``CgroupFs`` (``KernelFs`` on a host; a plain
directory tree in tests), and the directory names of the layout live here, so that the backends,
the tracking cgroups and the kill all name the same directories.

Layout (``<own>`` is the daemon's cgroup in that hierarchy, ``[<instance>/]`` optional):

- v2: ``<own>/elasticd.jobs/[<instance>/]<job>/rank_<k>``, plus ``<own>/elasticd.daemon``.
- v1: ``<own>/elasticd/[<instance>/]<job>/rank_<k>`` in the memory and in the cpu hierarchy.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Protocol

from elasticd import log

_log = log.get("elasticd.limits")

V2_JOBS = "elasticd.jobs"
V2_DAEMON = "elasticd.daemon"
V1_JOBS = "elasticd"
BUSY = (errno.EBUSY, errno.ENOTEMPTY)  # rmdir's errors while a cgroup holds processes or children


class CgroupFs(Protocol):
    """The cgroupfs operations the backends use (``KernelFs``; a fake tree in tests)."""

    def mkdir(self, path: Path) -> None: ...  # FileExistsError when it exists
    def rmdir(self, path: Path) -> None: ...  # EBUSY while it holds processes or children
    def read(self, path: Path) -> str: ...
    def write(self, path: Path, text: str) -> None: ...  # one write(2), as the kernel wants
    def open_procs(self, cgroup: Path) -> int: ...  # cgroup.procs, write-only, close-on-exec


class KernelFs:
    def mkdir(self, path: Path) -> None:
        os.mkdir(path, 0o755)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def read(self, path: Path) -> str:
        return path.read_text()

    def write(self, path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def open_procs(self, cgroup: Path) -> int:
        return os.open(cgroup / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)


def remove_cgroup(fs: CgroupFs, path: Path, tries: int = 1) -> bool:
    """rmdir, tolerating a missing directory; False while it stays busy (processes, children).

    A leaf can stay busy for a moment after its last process was reaped, hence ``tries``.
    """
    for attempt in range(tries):
        try:
            fs.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in BUSY:
                _log.warning("limits.rmdir_failed", path=str(path), error=str(exc))
                return False
        if attempt + 1 < tries:
            time.sleep(0.01 * (attempt + 1))
    return False
