"""Fakes and builders for unit tests, kept in one place."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from elasticd.jobs.spec import EntryKind, JobSpec, NodeRange

JOB = "train-0a1b2c3d"


def make_spec(**overrides: Any) -> JobSpec:
    """A valid JobSpec; each test file states only what it cares about."""
    fields: dict[str, Any] = {
        "id": JOB,
        "name": "train",
        "entry_kind": EntryKind.SCRIPT,
        "entry": "/home/u/train.py",
        "args": ("--epochs", "2"),
        "python": "/usr/bin/python3",
        "cwd": "/home/u",
        "env": {},
        "uid": 1000,
        "gid": 1000,
        "user": "u",
        "nnodes": NodeRange(1, 2),
        "nproc_per_node": 2,
        "submitted_at": 1700000000.5,
    }
    return JobSpec(**(fields | overrides))


# --- fake zygotes: small programs run by the real loader in place of zygote_boot ------------------

FAKE_ZYGOTE_HEAD = """
import json, os, signal, socket, sys, time
ctl = socket.socket(fileno=CTL_FD)
cfg = ctl.recv(65536)
def send(**m):
    ctl.send(json.dumps(m).encode())
def request():
    data, fds, _, _ = socket.recv_fds(ctl, 1 << 22, 8)
    for fd in fds:
        os.close(fd)
    return json.loads(data)
def child():
    pid = os.fork()
    if pid == 0:
        signal.pause()
        os._exit(0)
    return pid
"""
READY = "send(ev='ready', pid=os.getpid(), import_s=0.1)\n"


class NoReaper:
    def track(self, pgid: int, fence_job: str | None = None, markers: Sequence[str] = ()) -> None:
        return None

    def untrack(self, pgid: int) -> None:
        return None


async def until(what: Callable[[], Any]) -> None:
    """Wait (on the event loop) until ``what()`` holds; the caller bounds the wait."""
    while not what():
        await asyncio.sleep(0.01)
