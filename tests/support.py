"""Test support kept in one place: a real etcd, real daemons, the CLI, and waiting helpers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from elasticctl.client import Client
from elasticd.etcd import gateway as gw
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import find_etcd_binary
from elasticd.etcd.types import EtcdAuth
from elasticd.netaddr import free_port
from elasticd.workers.proctree import tree as proctree

if TYPE_CHECKING:
    from tests.tls import CertFiles

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.05, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(interval_s)


def hears_ctrl_c() -> None:
    """A ``preexec_fn`` for a child a test sends SIGINT: SIGINT back to its default action.

    A shell that starts the suite in the background (``&``, ``nohup``, a CI step) ignores SIGINT,
    every child inherits that, and Python leaves an inherited ignore in place instead of raising
    ``KeyboardInterrupt``: the test's Ctrl-C would go unheard and the test would wait it out.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 20.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class EtcdServer:
    """A real etcd on loopback with free ports and its own data dir.

    With ``tls`` (the server's certificate, also used towards peers) every listener speaks TLS
    and requires a client certificate signed by the same CA; ``admin`` is the client certificate
    that ``start`` uses to wait for health (and tests for etcdctl). Once a test has turned etcd
    auth on, it sets ``admin_password``: the password of etcd's ``root``, which clients then log
    in as (the JSON gateway takes no identity from a certificate).
    """

    def __init__(
        self,
        workdir: Path,
        name: str = "test",
        tls: CertFiles | None = None,
        admin: CertFiles | None = None,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.tls = tls
        self.admin = admin
        self.admin_password: str | None = None
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def endpoint(self) -> str:
        if self.tls is not None:
            return f"https://127.0.0.1:{self.client_port}"
        return f"127.0.0.1:{self.client_port}"

    def argv(self) -> list[str]:
        client = f"{self.scheme}://127.0.0.1:{self.client_port}"
        peer = f"{self.scheme}://127.0.0.1:{self.peer_port}"
        argv = [
            str(find_etcd_binary()),
            "--name", self.name,
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--log-level", "error",
        ]  # fmt: skip
        if self.tls is not None:
            t = self.tls
            argv += [
                "--client-cert-auth", "--trusted-ca-file", str(t.ca),
                "--cert-file", str(t.cert), "--key-file", str(t.key),
                "--peer-client-cert-auth", "--peer-trusted-ca-file", str(t.ca),
                "--peer-cert-file", str(t.cert), "--peer-key-file", str(t.key),
            ]  # fmt: skip
        return argv

    def client_auth(self) -> EtcdAuth:
        a = self.admin
        user = None if self.admin_password is None else "root"
        if a is None:
            return EtcdAuth(user=user, password=self.admin_password)
        return EtcdAuth(ca=a.ca, cert=a.cert, key=a.key, user=user, password=self.admin_password)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "etcd.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, start_new_session=True)
        log.close()
        client = EtcdClient([self.endpoint], self.client_auth(), timeout_s=1)
        try:
            wait_for(lambda: _healthy(client), 60, 0.1, "etcd to be healthy")  # (a loaded CI host is slow)
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def gateway_post(client: EtcdClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Any etcd v3 JSON gateway call, through the client's failover and login (for what the KV
    seam deliberately cannot do, like writing bytes that are not JSON)."""
    data = json.dumps(body).encode()
    return client.call(lambda transport, token: transport.post(path, data, token))


def put_raw(client: EtcdClient, key: str, value: bytes) -> None:
    gateway_post(client, "/v3/kv/put", gw.put_request(key, value, None))


def _healthy(client: Any) -> bool:
    from elasticd.errors import EtcdUnavailable

    try:
        client.health()
        return True
    except EtcdUnavailable:
        return False


@dataclass
class DaemonProc:
    """One running ``elasticd`` with its own node id, socket, state dir and log dir."""

    node_id: str
    root: Path
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    allow_root_jobs: bool = True  # the suite runs as root and submits as root; tests of the default unset it
    stderr_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.stderr_path = self.root / "daemon.log"

    @property
    def etcd_prefix(self) -> str:
        return (
            self.args[self.args.index("--etcd-prefix") + 1]
            if "--etcd-prefix" in self.args
            else "/elasticd/v6"
        )

    @property
    def etcd_client(self) -> str:
        """The client it talks to etcd through (``--etcd-client``; the daemon's default, the gateway)."""
        return self.args[self.args.index("--etcd-client") + 1] if "--etcd-client" in self.args else "gateway"

    def node_key(self) -> str:
        return f"{self.etcd_prefix}/nodes/{self.node_id}"

    @property
    def socket(self) -> Path:
        return self.root / "ctl.sock"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def launcher(self) -> list[str]:
        """What runs the daemon's command (nothing here; ``ip netns exec NS`` in tests/netns.py)."""
        return []

    def port_filter(self) -> str:
        """The filter's setting unless the test gives one: off. One nftables table per network
        namespace, replaced whole by each daemon: daemons of tests side by side in the host's
        would undo each other's (a daemon in a namespace of its own has it on: tests/netns.py)."""
        return "--no-port-filter"

    def start(self, wait: bool = True) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [
            *self.launcher(),
            PYTHON, "-m", "elasticd",
            "--socket", str(self.socket),
            "--state-dir", str(self.state_dir),
            "--log-dir", str(self.log_dir),
            "--node-id", self.node_id,
            "--log-format", "json",
            *(["--allow-root-jobs"] if self.allow_root_jobs else []),
            *([] if {"--port-filter", "--no-port-filter"} & set(self.args) else [self.port_filter()]),
            *self.args,
        ]  # fmt: skip
        err = open(self.stderr_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=err, stderr=err, env=self.env, cwd=self.root)
        err.close()
        if wait:
            wait_for(self.answers, 30, 0.1, f"daemon {self.node_id} to answer")

    def answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        try:
            self.call("ping", timeout_s=0.5)
            return True
        except Exception:
            return False

    def dump_tasks(self, timeout_s: float = 5.0) -> None:
        """Have a running daemon write each task's stack to its log (``SIGUSR1``), and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        before = len(self.events("daemon.tasks"))
        self.proc.send_signal(signal.SIGUSR1)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: self._dumped(before), timeout_s, 0.1, "the tasks' dump")

    def _dumped(self, before: int) -> bool:
        """Whether a dump after the first ``before`` is in the log whole: its count of tasks, each."""
        dumps = self.events("daemon.tasks")
        if len(dumps) <= before:
            return False
        stamp, count = str(dumps[-1]["timestamp"]), int(dumps[-1]["count"])
        return sum(1 for e in self.events("daemon.task") if str(e["timestamp"]) >= stamp) >= count

    def log_text(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == name:
                out.append(event)
        return out

    def client(self, timeout_s: float = 15.0) -> Client:
        return Client(self.socket, timeout_s=timeout_s)

    def call(self, cmd: str, timeout_s: float = 15.0, **args: Any) -> Any:
        client = self.client(timeout_s)
        try:
            return client.call(cmd, **args)
        finally:
            client.close()

    def ctl(
        self, *argv: str, timeout_s: float = 120.0, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        full_env = dict(env if env is not None else self.env) | {"ELASTICD_SOCKET": str(self.socket)}
        return subprocess.run(
            [PYTHON, "-m", "elasticctl", *argv],
            capture_output=True, text=True, timeout=timeout_s, env=full_env, cwd=cwd or self.root,
        )  # fmt: skip

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.call("status", job=job_id)["job"])

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout_s: float = 60.0) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (j := self.job(job_id))["state"] in states and j,
                timeout_s,
                0.1,
                f"job {job_id} to reach {states}",
            )
        )

    def stop(self, grace_s: float = 30.0) -> int | None:
        return stop_process(self.proc, grace_s) if self.proc is not None else None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def leftovers(self) -> list[psutil.Process]:
        return proctree.marked(self.node_id)

    def workers_left(self) -> list[psutil.Process]:
        """``leftovers`` but the zygotes the daemon keeps for the next identical job (alive by design)."""
        parked = parked_zygotes(self)
        return [p for p in self.leftovers() if p.pid not in parked]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_script(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def etcd_available() -> bool:
    try:
        find_etcd_binary()
        return True
    except Exception:
        return shutil.which("etcd") is not None


def worker_records(out: Path, round_no: int) -> list[dict[str, Any]]:
    """What each worker of a round wrote at start (tests/scripts/member.py)."""
    found = []
    for path in sorted(out.glob(f"w.{round_no}.*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:  # being written
            continue
    return sorted(found, key=lambda r: int(r["RANK"]))


def alive_pid(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_cluster(
    factory: Callable[..., DaemonProc], n: int, *flags: str, ttl: float = 3.0
) -> list[DaemonProc]:
    """``n`` daemons ("hosts") against the shared etcd, with node ids that sort in start order (and
    the factory's ``--etcd-client`` for each: mixed, they alternate gateway, grpc, ...)."""
    tag = unique("h")
    return [factory(f"{tag}-{i}", "--lease-ttl", str(ttl), "--slots", "2", *flags) for i in range(n)]


def submit_job(d: DaemonProc, out: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    """``elasticctl submit`` through ``d``; workers get OUT=out. Returns the job id."""
    res = d.ctl("submit", *argv, env=dict(os.environ, OUT=str(out)) | (env or {}))
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


def wait_round(out: Path, round_no: int, world: int, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Wait until ``world`` workers of ``round_no`` have started (tests/scripts/member.py)."""
    return list(
        wait_for(
            lambda: len(r := worker_records(out, round_no)) == world and r,
            timeout_s,
            0.05,
            f"{world} workers of round {round_no}",
        )
    )


def log_events(daemon: DaemonProc, name: str | None = None, **fields: Any) -> list[dict[str, Any]]:
    """The daemon's JSON log events in the order it wrote them: every one, or those named ``name``
    whose fields have these values (``job=..., round=1``)."""
    found = []
    for line in daemon.log_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # not JSON, or a line still being written
            continue
        if not isinstance(event, dict) or (name is not None and event.get("event") != name):
            continue
        if all(event.get(k) == v for k, v in fields.items()):
            found.append(event)
    return found


def parked_zygotes(daemon: DaemonProc) -> set[int]:
    """Pids of the zygotes ``daemon`` parked (``workers.warm.pool``) and has not let go since."""
    last: dict[int, str] = {}
    for event in log_events(daemon):
        if str(event.get("event", "")).startswith("zygote.") and isinstance(event.get("pid"), int):
            last[event["pid"]] = event["event"]
    return {pid for pid, name in last.items() if name == "zygote.parked"}


def wait_log(daemon: DaemonProc, name: str, timeout_s: float = 30.0, **fields: Any) -> dict[str, Any]:
    """Wait until the daemon has logged event ``name`` with these field values; the first such event."""
    what = f"{daemon.node_id} to log {name} {fields}"
    return dict(wait_for(lambda: log_events(daemon, name, **fields), timeout_s, 0.05, what)[0])


def wait_job(
    daemon: DaemonProc, job_id: str, done: Callable[[dict[str, Any]], Any], what: str, timeout_s: float = 30.0
) -> dict[str, Any]:
    """Wait until ``done(status)`` holds for the job's status as ``daemon`` reports it; that status."""
    return dict(wait_for(lambda: v if done(v := daemon.job(job_id)) else None, timeout_s, 0.1, what))
