"""Helpers for tests that act as another user: uid nobody sending requests, and a daemon it can reach.

The venv's python lives under /root, which other users cannot enter, so jobs of other users run
Debian's /usr/bin/python3, and everything they touch lives in a 0755 directory under /tmp. A job
of another user that needs torch gets the venv's packages as a tree of hard links in such a
directory (``torch_for``): no copy of ~800 MB, and nothing of the venv's own permissions changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
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


def torch_for(uid: int, public: Path) -> tuple[str, dict[str, str]]:
    """A python that ``uid`` can run and import torch with, and the environment it needs: the
    suite's own where ``uid`` can run it, else Debian's with the venv's packages hard-linked (or,
    across filesystems, copied) under ``public`` when it is the venv's python version. Skips the
    test, saying why, where neither works."""
    why = _cannot_import_torch(uid, sys.executable, {})
    if why is None:
        return sys.executable, {}
    tried = [why]
    if _same_minor(SYSTEM_PYTHON):
        packages = public / "site-packages"
        venv = sysconfig.get_paths()["purelib"]
        if subprocess.run(["cp", "-al", venv, str(packages)], capture_output=True).returncode != 0:
            shutil.rmtree(packages, ignore_errors=True)
            shutil.copytree(venv, packages, symlinks=True)
        env = {"PYTHONPATH": str(packages)}
        why = _cannot_import_torch(uid, SYSTEM_PYTHON, env)
        if why is None:
            return SYSTEM_PYTHON, env
        tried.append(why)
    else:
        tried.append(f"{SYSTEM_PYTHON} is not python {sys.version_info.major}.{sys.version_info.minor}")
    pytest.skip(f"no python that uid {uid} can import torch with: {'; '.join(tried)}")


def _cannot_import_torch(uid: int, python: str, env: dict[str, str]) -> str | None:
    """Why ``uid`` cannot import torch with ``python`` and ``env`` (None: it can)."""
    try:
        done = subprocess.run(
            [python, "-c", "import torch.distributed"],
            user=uid, capture_output=True, text=True, timeout=120, cwd="/",
            env={"PATH": "/usr/bin:/bin", **env},
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python} cannot be run by uid {uid}: {exc}"
    if done.returncode != 0:
        return f"uid {uid} cannot import torch with {python}: {done.stderr.strip()[-200:]}"
    return None


def _same_minor(python: str) -> bool:
    """Whether ``python`` is the suite's python's version (its packages' wheels are built for it)."""
    if not os.path.exists(python):
        return False
    asked = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=60
    )
    return asked.stdout.strip() == str(tuple(sys.version_info[:2]))
