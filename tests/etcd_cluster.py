"""A real 3-member etcd cluster on loopback, for tests of failover between etcd endpoints."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from elasticd.errors import EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import find_etcd_binary
from elasticd.netaddr import free_port
from tests.support import gateway_post, stop_process, wait_for

HOST = "127.0.0.1"


class EtcdCluster:
    """``size`` etcd members (m0, m1, ...) on loopback with free ports and data dirs under ``workdir``.

    Every member is its own session (``start_new_session``) and logs to ``<data dir>/etcd.log``.
    ``kill(i)`` SIGKILLs one member, ``start(i)`` brings it back on the same ports and data dir
    (etcd ignores the ``--initial-*`` flags once its data dir holds a member), ``stop()`` stops all.
    """

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        self.size = size
        self.token = f"elasticd-test-{uuid.uuid4().hex[:12]}"
        self.names = [f"m{i}" for i in range(size)]
        self.client_ports = [free_port(HOST) for _ in range(size)]
        self.peer_ports = [free_port(HOST) for _ in range(size)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def endpoints(self) -> list[str]:
        return [f"{HOST}:{port}" for port in self.client_ports]

    def data_dir(self, i: int) -> Path:
        return self.workdir / self.names[i]

    def log_path(self, i: int) -> Path:
        return self.data_dir(i) / "etcd.log"

    def _peer_url(self, i: int) -> str:
        return f"http://{HOST}:{self.peer_ports[i]}"

    def argv(self, i: int) -> list[str]:
        client = f"http://{HOST}:{self.client_ports[i]}"
        initial = ",".join(f"{self.names[j]}={self._peer_url(j)}" for j in range(self.size))
        return [
            str(find_etcd_binary()),
            "--name", self.names[i],
            "--data-dir", str(self.data_dir(i) / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", self._peer_url(i),
            "--initial-advertise-peer-urls", self._peer_url(i),
            "--initial-cluster", initial,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.token,
            "--log-level", "error",
        ]  # fmt: skip

    def _spawn(self, i: int) -> None:
        if self.alive(i):
            raise RuntimeError(f"etcd member {self.names[i]} is already running")
        self.data_dir(i).mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(i), "ab")  # noqa: SIM115 - handed to the child
        try:
            self.procs[i] = subprocess.Popen(
                self.argv(i), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log.close()

    def start_all(self, timeout_s: float = 30.0) -> None:
        """Start every member (they need each other to elect a leader), then wait until all are healthy."""
        try:
            for i in range(self.size):
                self._spawn(i)
            for i in range(self.size):
                self.wait_healthy(i, timeout_s)
        except BaseException:
            self.stop()
            raise

    def start(self, i: int, timeout_s: float = 30.0) -> None:
        """(Re)start member ``i`` and wait until it is healthy and part of a quorum."""
        self._spawn(i)
        self.wait_healthy(i, timeout_s)

    def healthy(self, i: int) -> bool:
        """Member ``i`` answers, and a linearizable read through it succeeds (so it sees a quorum)."""
        proc = self.procs[i]
        if proc is None:
            return False
        if proc.poll() is not None:
            tail = self.log_path(i).read_text(errors="replace")[-2000:] if self.log_path(i).exists() else ""
            raise AssertionError(f"etcd member {self.names[i]} exited with {proc.returncode}:\n{tail}")
        client = EtcdClient([self.endpoints[i]], timeout_s=1.0)
        try:
            client.health()
            client.get("/health-probe")
            return True
        except EtcdUnavailable:
            return False
        finally:
            client.close()

    def wait_healthy(self, i: int, timeout_s: float = 30.0) -> None:
        wait_for(lambda: self.healthy(i), timeout_s, 0.1, f"etcd member {self.names[i]} to be healthy")

    def leader(self) -> int | None:
        """Index of the current raft leader, as the first live member that answers sees it."""
        for i in range(self.size):
            if not self.alive(i):
                continue
            client = EtcdClient([self.endpoints[i]], timeout_s=1.0)
            try:
                leader = gateway_post(client, "/v3/maintenance/status", {}).get("leader")
                members = gateway_post(client, "/v3/cluster/member/list", {}).get("members", [])
            except EtcdUnavailable:
                continue
            finally:
                client.close()
            names = [m.get("name") for m in members if m.get("ID") == leader]
            if names and names[0] in self.names:
                return self.names.index(names[0])
        return None

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.poll() is None

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (no clean shutdown: its clients see the connection drop)."""
        proc, self.procs[i] = self.procs[i], None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self) -> None:
        """Stop every member: SIGTERM, then SIGKILL after a grace period. Safe to call twice."""
        for i, proc in enumerate(self.procs):
            self.procs[i] = None
            if proc is not None:
                stop_process(proc, 10)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.poll() is None]

    def __enter__(self) -> EtcdCluster:
        self.start_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
