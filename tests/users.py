"""Helpers for tests that act as another user: uid nobody sending requests, and a daemon it can reach.

The venv's python lives under /root, which other users cannot enter, so jobs of other users run
Debian's /usr/bin/python3, and everything they touch lives in a 0755 directory under /tmp.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from elasticctl.client import Client, DaemonError
from tests.conftest import DaemonFactory
from tests.support import DaemonProc

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# What a test of another user's job needs: root (to run a daemon that switches users) and a python
# uid nobody can run. As a module's ``pytestmark``, or on one test with ``other_users``.
OTHER_USERS = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a daemon that switches users"),
    pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs a python that uid nobody can run"),
]


def other_users(test: Callable[..., None]) -> Callable[..., None]:
    for mark in OTHER_USERS:
        test = mark(test)
    return test


def public_workdir(public: Path) -> Path:
    """``<public>/work``, writable by anyone: the cwd of another user's job."""
    work = public / "work"
    work.mkdir(mode=0o777)
    work.chmod(0o777)  # whatever the umask took away
    return work


@contextmanager
def public_dir(prefix: str = "elasticd-uid-") -> Iterator[Path]:
    """A 0755 root directory other users can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(uid: int, gid: int, socket: Path, cmd: str, **args: Any) -> dict[str, Any]:
    """Send one request from a forked child that has dropped to ``uid``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            client = Client(socket, timeout_s=15)
            try:
                reply: dict[str, Any] = {"ok": True, "result": client.call(cmd, **args)}
            except DaemonError as exc:
                reply = {"ok": False, "code": exc.code, "message": exc.message}
            os.write(write_fd, json.dumps(reply).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def public_daemon(daemon_factory: DaemonFactory, root: Path, *extra: str) -> DaemonProc:
    """A daemon whose socket (0666), state and logs live under ``root``, reachable by anyone."""
    env = dict(os.environ, ELASTICD_SOCKET_MODE="666")
    d = daemon_factory(None, *extra, start=False, env=env, embedded=False)
    d.root = root / "daemon"
    d.stderr_path = root / "daemon" / "daemon.log"
    d.start()
    return d
