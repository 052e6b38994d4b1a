"""Reading the job log tree as root, safely: ``<log_dir>/<job>/attempt_<n>/rank_<k>.log`` and
the error and stack files beside them.

The daemon reads on behalf of whoever asks, from a tree whose files the jobs write, so every read
walks from the configured root with directory fds (``logdir.open_dir``: no link followed), opens
``O_NOFOLLOW|O_NONBLOCK`` (a FIFO planted where a log was cannot block the daemon), and skips
anything but a regular file. A file that is missing or unsafe reads as nothing, never as an error.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from elasticd.jobs.logdir import check_name, open_dir
from elasticd.terms.state import SetupFailure

MAX_ERROR_FILE = 1024 * 1024
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextlib.contextmanager
def _opened(log_dir: Path, parts: tuple[str, ...]) -> Iterator[int | None]:
    """A regular file of the tree, open for reading; None when missing or anything but safe."""
    fd: int | None = None
    try:
        dir_fd = open_dir(log_dir, parts[:-1], create=False)
        if dir_fd is not None:
            try:
                check_name(parts[-1], log_dir)
                fd = os.open(parts[-1], _READ, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
    except (OSError, SetupFailure):
        fd = None
    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _pread(fd: int, limit: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while limit > 0:
        data = os.pread(fd, limit, offset)
        if not data:
            break
        chunks.append(data)
        limit -= len(data)
        offset += len(data)
    return b"".join(chunks)


def read_range(log_dir: Path, parts: tuple[str, ...], offset: int, limit: int) -> bytes | None:
    """Up to ``limit`` bytes at ``offset`` of ``<log_dir>/<parts...>``; None if it cannot be read."""
    with _opened(log_dir, parts) as fd:
        return None if fd is None else _pread(fd, limit, max(0, offset))


def read_end(log_dir: Path, parts: tuple[str, ...], limit: int) -> tuple[bytes, int]:
    """The last ``limit`` bytes of a file of the tree and the offset they start at ((b"", 0) if it
    cannot be read): with ``limit`` 0, its size."""
    with _opened(log_dir, parts) as fd:
        if fd is None:
            return b"", 0
        start = max(0, os.fstat(fd).st_size - limit)
        return _pread(fd, limit, start), start


def read_tail(log_dir: Path, parts: tuple[str, ...], limit: int) -> bytes:
    """The last ``limit`` bytes of a file of the tree (empty if it cannot be read)."""
    return read_end(log_dir, parts, limit)[0]


def read_small(log_dir: Path, parts: tuple[str, ...], limit: int = MAX_ERROR_FILE) -> bytes:
    """A whole small file of the tree (the first ``limit`` bytes; empty if it cannot be read)."""
    return read_range(log_dir, parts, 0, limit) or b""


def list_dir(log_dir: Path, parts: tuple[str, ...]) -> list[str]:
    """Names in a directory of the tree; empty when it is missing or unsafe."""
    try:
        fd = open_dir(log_dir, parts, create=False)
    except (OSError, SetupFailure):
        return []
    if fd is None:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def dir_times(log_dir: Path, parts: tuple[str, ...]) -> dict[str, float]:
    """The directories in a directory of the tree, with their mtimes (links are left out)."""
    try:
        fd = open_dir(log_dir, parts, create=False)
    except (OSError, SetupFailure):
        return {}
    times: dict[str, float] = {}
    if fd is not None:
        try:
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        times[name] = st.st_mtime
        finally:
            os.close(fd)
    return times
