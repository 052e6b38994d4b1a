"""What the zygote's workers would run: the file behind each module it imported (and its
interpreter), and what each looked like once the imports were done.

A worker forked from a parked zygote runs the code the zygote imported, not what is on disk by
then: a job may adopt it only while none of those files changed (``Zygote.check``). The zygote
records the files' stamps when it is ready and re-reads them for each check, as the submitter
(the daemon never opens a user's files).

A part of the zygote's program (``warm.spawn.BOOT_PARTS``): standard library only, run in the
job's interpreter before ``boot``, whose globals these names become.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (annotations only: the job's python may be older than the daemon's)
    Stamp = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size of one file


def module_files() -> list[str]:
    """The interpreter and the file of every loaded module (absolute paths, sorted)."""
    files = {sys.executable} if sys.executable else set()
    for mod in list(sys.modules.values()):
        try:
            path = getattr(mod, "__file__", None)
        except Exception:  # a lazy module's __getattr__
            continue
        if isinstance(path, str) and path:
            files.add(os.path.abspath(path))
    return sorted(files)


def stamps(paths: list[str], since_ns: int) -> dict[str, Stamp]:
    """Each path's ``(st_dev, st_ino, st_mtime_ns, st_size)``; paths that are not files are left
    out (a zip import's member). A file modified at or after ``since_ns`` (when the imports began)
    may have changed after it was imported: its stamp never matches (``st_mtime_ns`` -1)."""
    found: dict[str, Stamp] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        mtime = st.st_mtime_ns if st.st_mtime_ns < since_ns else -1
        found[path] = (st.st_dev, st.st_ino, mtime, st.st_size)
    return found


def changed(recorded: dict[str, Stamp]) -> str | None:
    """The first recorded file that is gone, replaced or edited since (None: all as they were)."""
    for path, stamp in recorded.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size) != stamp:
            return path
    return None
