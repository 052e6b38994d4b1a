"""The job log tree ``<log_dir>/<job>/attempt_<n>/rank_<k>.log``, created and read safely as root.

Workers run as the submitter, so anything a job can write to is hostile to a root daemon: a symlink
or hard link planted where the next attempt's log goes would make root chown, append to or print a
file of the attacker's choosing. Hence:

- every directory of the tree is root's (the daemon's euid), mode 0755, and never handed to the
  user; an existing one that is not a directory, not ours, or group/other-writable is refused;
- every step is an ``openat`` relative to the parent's fd with ``O_NOFOLLOW``, so no name is
  resolved twice and no symlink is followed below the configured root;
- per-rank files are created ``O_EXCL`` and only then given to the submitter (``fchown`` on the
  fd); an existing file is reused only when it is a regular file with one link, already the
  submitter's, and is never chowned;
- reads open ``O_NOFOLLOW|O_NONBLOCK``, check for a regular file, and skip anything else.

The path *to* the configured root is the operator's: it is resolved once (following only links
owned by root or us: a user's link in /tmp is not the operator's), then walked without following
links, and each ancestor must belong to root or us and not be writable by everyone (unless
sticky, like /tmp). Group-writable ancestors are accepted (Ubuntu's /var/log is
root:syslog 0775); the root itself must be ours alone, which is what guards the tree.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from elasticd import log, trustedpath
from elasticd.errors import ConfigError
from elasticd.terms.ids import valid_job_id
from elasticd.terms.state import EndReason, SetupFailure

_log = log.get("elasticd.logdir")

DIR_MODE = 0o755
DISK_FULL_BYTES = 64 * 1024  # less than this left for unprivileged writers: the disk is full
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_REUSE = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)


@dataclass(frozen=True)
class Owner:
    """Who a rank's files belong to: the user its workers run as, and who else may read them."""

    uid: int
    gid: int
    mode: int = 0o600  # 0o640 when the operator's ``log_group`` may read job logs

    @classmethod
    def of(cls, uid: int, gid: int, log_gid: int | None = None) -> Owner:
        return cls(uid, gid) if log_gid is None else cls(uid, log_gid, 0o640)


@dataclass(frozen=True)
class RankFiles:
    """One rank's log, open for appending (the worker's stdout and stderr), and the error file's
    path for ``TORCHELASTIC_ERROR_FILE``, which the worker opens as the user."""

    rank: int
    log_fd: int
    log_path: Path
    error_path: Path


def log_group_gid(name: str | None) -> int | None:
    """The gid of the operator's ``log_group`` setting (a name or a number)."""
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"log_group {name!r}: no such group") from None


def log_disk_full(log_dir: Path) -> bool:
    """Whether the log file system has (almost) nothing left for the user's writes, to tell a
    worker that died writing its output from one that failed on its own."""
    try:
        st = os.statvfs(log_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < DISK_FULL_BYTES


def _unsafe(path: Path, why: str) -> SetupFailure:
    _log.warning("logdir.refused", path=str(path), why=why)
    return SetupFailure(EndReason.LOG_DIR_UNSAFE, f"job log path {path} is unsafe: {why}")


def disk_full(where: Path, node: str) -> SetupFailure:
    return SetupFailure(EndReason.LOG_DISK_FULL, f"no space left for job logs in {where} on node {node}")


def _full_or_raise(exc: OSError, where: Path, node: str) -> None:
    if exc.errno in _FULL:
        raise disk_full(where, node) from exc


def check_name(name: str, where: Path) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise _unsafe(where / name, "not a plain file name")


def _check_dir(fd: int, path: Path, ancestor: bool) -> None:
    """Ours alone (the tree), or root's or ours and not writable by all unless sticky (above it)."""
    st = os.fstat(fd)
    euid = os.geteuid()
    if ancestor:
        why = trustedpath.ancestor_problem(st)
        if why is None:
            return
    elif not stat.S_ISDIR(st.st_mode):
        why = "not a directory"
    elif st.st_uid != euid:
        why = f"owned by uid {st.st_uid}, not uid {euid}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"group- or other-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return
    raise _unsafe(path, why)


def _step(parent: int, name: str, path: Path, create: bool, node: str, ancestor: bool = False) -> int | None:
    """Open (making it if ``create``) directory ``name`` under the ``parent`` fd; None if missing."""
    check_name(name, path.parent)
    made = False
    for _ in range(3):  # mkdir and open race with a concurrent creator or remover: retry a little
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, DIR_MODE, dir_fd=parent)
                made = True
            except FileExistsError:
                pass
            except OSError as exc:
                _full_or_raise(exc, path.parent, node)
                raise
            continue
        except OSError as exc:
            if exc.errno in _NOT_A_DIR:
                raise _unsafe(path, "a symbolic link or not a directory") from exc
            raise
        try:
            _check_dir(fd, path, ancestor)
            if made:  # whatever the umask: users must reach their error files
                os.fchmod(fd, DIR_MODE)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise _unsafe(path, "keeps appearing and disappearing")


def _resolve(log_dir: Path) -> Path:
    """``log_dir`` with its symlinks resolved, following only those of root or our euid. A race
    with this (a name swapped afterwards) is caught by the ``O_NOFOLLOW`` walk in ``open_dir``."""
    try:
        return trustedpath.resolve(log_dir)
    except trustedpath.UnsafePath as exc:
        raise _unsafe(exc.path, exc.why) from None


def open_dir(log_dir: Path, parts: tuple[str, ...], create: bool, node: str = "") -> int | None:
    """An fd of ``<log_dir>/<parts...>``, walked from ``/`` without following links; None when
    missing (and not ``create``). Raises ``SetupFailure`` if any step is unsafe or the disk full."""
    real = _resolve(log_dir)
    names = real.parts[1:]
    if not names:
        raise _unsafe(real, "the file system root cannot be the log directory")
    steps = [(n, Path("/", *names[: i + 1]), i < len(names) - 1) for i, n in enumerate(names)]
    steps += [(p, real.joinpath(*parts[: i + 1]), False) for i, p in enumerate(parts)]
    fd = os.open("/", _DIR)
    try:
        for name, path, ancestor in steps:
            nxt = _step(fd, name, path, create, node, ancestor)
            os.close(fd)
            fd = -1
            if nxt is None:
                return None
            fd = nxt
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def _open_existing(dir_fd: int, name: str, path: Path, owner: Owner, truncate: bool) -> int:
    """Reuse a file a previous daemon created: only our own kind of file, never chowned."""
    try:
        fd = os.open(name, _REUSE, dir_fd=dir_fd)
    except OSError as exc:
        raise _unsafe(path, f"exists and cannot be reused ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _unsafe(path, "exists and is not a regular file")
        if st.st_nlink != 1:
            raise _unsafe(path, f"exists with {st.st_nlink} hard links")
        if st.st_uid != owner.uid:
            raise _unsafe(path, f"exists and is owned by uid {st.st_uid}, not uid {owner.uid}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(dir_fd: int, name: str, path: Path, owner: Owner, node: str, truncate: bool = False) -> int:
    """Create ``name`` under ``dir_fd`` for ``owner`` (or reuse it, see ``_open_existing``); an fd
    open for appending. ``truncate`` empties a reused file (a stale error file from before)."""
    check_name(name, path.parent)
    try:
        fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        return _open_existing(dir_fd, name, path, owner, truncate)
    except OSError as exc:
        _full_or_raise(exc, path.parent, node)
        raise
    try:
        os.fchown(fd, owner.uid, owner.gid)  # EDQUOT: the file now counts against the user's quota
        os.fchmod(fd, owner.mode)
    except BaseException as exc:
        os.close(fd)
        # Ours alone: the directory is checked not writable by anyone else, so the name is ours.
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        if isinstance(exc, OSError):
            _full_or_raise(exc, path.parent, node)
        raise
    return fd


def create_attempt(
    log_dir: Path, job_id: str, attempt: int, ranks: list[int], owner: Owner, node: str
) -> list[RankFiles]:
    """Make ``<job>/attempt_<n>`` and each rank's log and (empty) error file. The worker cannot
    create the error file itself: the attempt directory is root's. On failure nothing stays open."""
    parts = (job_id, f"attempt_{attempt}")
    directory = Path(log_dir).joinpath(*parts)
    dir_fd = open_dir(log_dir, parts, create=True, node=node)
    assert dir_fd is not None
    files: list[RankFiles] = []
    try:
        for rank in ranks:
            log_path, error_path = directory / f"rank_{rank}.log", directory / f"rank_{rank}.error.json"
            fd = create_file(dir_fd, log_path.name, log_path, owner, node)
            files.append(RankFiles(rank, fd, log_path, error_path))
            os.close(create_file(dir_fd, error_path.name, error_path, owner, node, truncate=True))
    except BaseException:
        for f in files:
            os.close(f.log_fd)
        raise
    finally:
        os.close(dir_fd)
    return files


def remove_job(log_dir: Path, job_id: str) -> bool:
    """Delete ``<log_dir>/<job>`` and everything in it, never following a link (the walk is done
    with directory fds: a link a job planted is removed, not followed). True if it existed."""
    if not valid_job_id(job_id):
        return False
    try:
        fd = open_dir(log_dir, (), create=False)
    except (OSError, SetupFailure):
        return False
    if fd is None:
        return False
    try:
        os.stat(job_id, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        os.close(fd)
        return False
    try:
        # fd-based on Linux (``shutil.rmtree.avoids_symlink_attacks``). ``rm`` and the sweep of
        # logs whose records are gone may remove one tree at once: what the other removed first
        # is gone, which is what both want.
        shutil.rmtree(job_id, dir_fd=fd, onerror=_gone_is_fine)
        return True
    finally:
        os.close(fd)


_ExcInfo = tuple[type[BaseException], BaseException, object]


def _gone_is_fine(func: object, path: str, exc_info: _ExcInfo) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
