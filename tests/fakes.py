"""Fakes and builders for unit tests, kept in one place."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.jobs.attempt import NodeRuntime
from elasticd.manager.jobmanager import JobManager
from elasticd.node.inventory import Inventory
from elasticd.node.statedir import StateDir
from elasticd.terms.head import JobHead, body_bytes
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec, NodeRange

JOB = "train-0a1b2c3d"


def bare_manager(kv: KV, keys: Keys, tmp: Path, lease: int | None = None) -> JobManager:
    """A ``JobManager`` on ``kv`` with no registry, reaper or workers: for its watch and wake-ups;
    with ``lease`` (the node's, from ``kv``), for its scan too."""
    rt = NodeRuntime("n1", "127.0.0.1", tmp, Inventory((), 2), SimpleNamespace())  # type: ignore[arg-type]
    registry = SimpleNamespace(lease_id=lease, publish_soon=lambda: None)
    return JobManager(rt, kv, keys, StateDir(tmp), registry)  # type: ignore[arg-type]


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


def head_of(spec: JobSpec) -> JobHead:
    """The head a store writes for ``spec`` (``JobStore.create``)."""
    return JobHead.of(spec, len(body_bytes(spec)))


def make_head(**overrides: Any) -> JobHead:
    """The head of ``make_spec(**overrides)``."""
    return head_of(make_spec(**overrides))


class ScriptedGateway:
    """A stand-in for etcd's JSON gateway on loopback: each POST gets the next answer scripted
    for its path (``answer``), else 200 with ``{}`` (a fresh token for a login). It records every
    request as (path, Authorization header, JSON body) and counts connections."""

    def __init__(self) -> None:
        self.script: defaultdict[str, deque[tuple[int, str]]] = defaultdict(deque)
        self.requests: list[tuple[str, str | None, Any]] = []
        self.connections = 0
        self.close_after_reply = False  # close each connection without saying so (an idle timeout)
        self._logins = 0
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                gateway.connections += 1
                super().setup()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
                gateway.requests.append((self.path, self.headers.get("Authorization"), body))
                status, text = gateway.next_answer(self.path)
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = gateway.close_after_reply

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, status: int, body: Any) -> None:
        self.script[path].append((status, body if isinstance(body, str) else json.dumps(body)))

    def next_answer(self, path: str) -> tuple[int, str]:
        if self.script[path]:
            return self.script[path].popleft()
        if path == "/v3/auth/authenticate":
            self._logins += 1
            return 200, json.dumps({"token": f"token-{self._logins}"})
        return 200, "{}"

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- fake zygotes: small programs run by the real loader in place of zygote_program.boot ------------------

# A fake forks with ``fork()``, never ``os.fork()``: its children die with it, as the real program's do
# (``zygote_program.child``). The daemon's side kills only the fake (``Zygote.close``), so a test that
# ends before it stopped a child (a failed assertion, a timeout, a killed pytest worker) would leave
# that child running, reparented to pid 1, under the zygote's command line.
FAKE_ZYGOTE_HEAD = """
import ctypes, json, os, signal, socket, sys, time
ctl = socket.socket(fileno=CTL_FD)
cfg = ctl.recv(65536)
def send(**m):
    ctl.send(json.dumps(m).encode())
def request():
    data, fds, _, _ = socket.recv_fds(ctl, 1 << 22, 8)
    for fd in fds:
        os.close(fd)
    return json.loads(data)
def fork():
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != me:
            os._exit(0)
    return pid
def child():
    pid = fork()
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
