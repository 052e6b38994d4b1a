"""Paths the operator configured, opened by root: which links and directories may be trusted,
and how a root-only secret (the etcd password file) is read.

A configured path may still pass through a directory that a user can write (a typo, /tmp, a home
directory); root must then not follow that user's links nor read what the user put there. So a
path is first resolved following only symlinks owned by root or our euid (a user's link in /tmp
is not the operator's), then walked from ``/`` with ``O_NOFOLLOW``: every directory on the way
must belong to root or us and not be writable by everyone unless sticky (like /tmp). A race
(a name swapped after the resolution) meets the ``O_NOFOLLOW`` walk. ``elasticd.jobs.logdir``
walks its log root the same way.

Kubernetes' Secret volumes pass: their ``..data`` links are root's, their files root's with the
volume's ``defaultMode``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from elasticd.errors import ConfigError

SECRET_MAX_BYTES = 4096
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafePath(Exception):
    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def resolve(path: Path) -> Path:
    """``path`` with its symlinks resolved, following only those of root or our euid."""
    done, rest, hops = Path("/"), list(Path(os.path.abspath(path)).parts[1:]), 40
    while rest:
        name = rest.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            done = done.parent
            continue
        candidate = done / name
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            return candidate.joinpath(*rest)
        if not stat.S_ISLNK(st.st_mode):
            done = candidate
            continue
        hops -= 1
        if st.st_uid not in (0, os.geteuid()) or hops < 0:
            raise UnsafePath(candidate, f"a symbolic link of uid {st.st_uid} (or a loop)")
        target = Path(os.readlink(candidate))
        rest = list(target.parts[1:] if target.is_absolute() else target.parts) + rest
        done = Path("/") if target.is_absolute() else done
    return done


def ancestor_problem(st: os.stat_result) -> str | None:
    """Why a directory above a trusted path is not fit to be one, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return "writable by everyone"
    return None


def read_secret(path: Path, setting: str) -> str:
    """The text of a root-only file: a regular file of our euid, no access for group or others,
    at most 4 KiB, under trusted directories; one trailing newline is dropped. Raises
    ConfigError naming ``setting`` and what is wrong (never the content)."""
    try:
        real = resolve(path)
        secret = _open_under_trusted(real)
        try:
            data = _read_own_file(secret, real)
        finally:
            os.close(secret)
    except UnsafePath as exc:
        raise ConfigError(f"{setting} {path} is unsafe: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be read: {exc.strerror}") from None
    text = data.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"{setting} {path} is empty")
    return text


def trusted_file(path: Path, setting: str) -> Path:
    """``path`` resolved, once checked to be a regular file of our euid under trusted directories
    (no user can replace it or a directory above it): what root may read again by name."""
    try:
        real = resolve(path)
        fd = _open_under_trusted(real)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise UnsafePath(real, f"not a regular file of uid {os.geteuid()} that only it may write")
    except UnsafePath as exc:
        raise ConfigError(f"{setting} {path} is unsafe: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be read: {exc.strerror}") from None
    return real


def _open_under_trusted(real: Path) -> int:
    """An fd of ``real`` (resolved), opened by a walk from ``/`` through trusted directories."""
    names = real.parts[1:]
    fd = os.open("/", _DIR)
    try:
        for i, name in enumerate(names[:-1]):
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if (why := ancestor_problem(os.fstat(fd))) is not None:
                raise UnsafePath(Path("/", *names[: i + 1]), why)
        return os.open(names[-1] if names else ".", _READ, dir_fd=fd)
    finally:
        os.close(fd)


def _read_own_file(fd: int, path: Path) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(path, "not a regular file")
    if st.st_uid != os.geteuid():
        raise UnsafePath(path, f"owned by uid {st.st_uid}, not uid {os.geteuid()}")
    if st.st_mode & 0o077:
        raise UnsafePath(
            path, f"readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}; chmod 600)"
        )
    if st.st_size > SECRET_MAX_BYTES:
        raise UnsafePath(path, f"larger than {SECRET_MAX_BYTES} bytes")
    return os.read(fd, SECRET_MAX_BYTES + 1)
