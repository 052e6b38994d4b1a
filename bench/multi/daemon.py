"""One elasticd "node" of a bench_multi trial, against the bench's etcd, and what its log says."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.daemon import start_daemon
from harness.paths import REPO

from multi.trial import DAEMON_SHUTDOWN_S, DAEMON_STOP_GRACE_S, LEASE_TTL


class Daemon:
    """One elasticd ("node") of a trial, against the bench's etcd."""

    def __init__(
        self,
        bin_dir: Path,
        base_env: dict[str, str],
        etcd_endpoint: str,
        root: Path,
        node_id: str,
        prefix: str,
        flags: tuple[str, ...] = (),  # more daemon flags (``--slots 2``)
    ) -> None:
        self.bin = bin_dir
        self.flags = flags
        self.base_env = base_env
        self.etcd_endpoint = etcd_endpoint
        self.root = root
        self.node_id = node_id
        self.prefix = prefix
        self.socket = root / "ctl.sock"
        self.err = root / "daemon.stderr.jsonl"
        self.proc: subprocess.Popen[bytes] | None = None
        self.shutdown_hung = False

    def start(self) -> None:
        self.root.mkdir(parents=True)
        extra = [
            "--etcd-endpoints", self.etcd_endpoint,
            "--etcd-prefix", self.prefix,
            "--address", "127.0.0.1",  # every "node" is this host (left unset: no multi-node job)
            "--lease-ttl", str(LEASE_TTL),
            *self.flags,
        ]  # fmt: skip
        self.proc = start_daemon(
            self.bin,
            self.root,
            socket=self.socket,
            node_id=self.node_id,
            stop_grace_s=DAEMON_STOP_GRACE_S,
            env=self.base_env,
            err=self.err,
            extra=extra,
        )

    def ctl(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "elasticctl"), *args],
            env=self.base_env | {"ELASTICD_SOCKET": str(self.socket)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"elasticd {self.node_id} exited with {self.proc and self.proc.returncode}"
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self.ctl("--timeout", "2", "ping", timeout_s=10).returncode == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"elasticd {self.node_id} did not answer ping in time")

    def status(self, job: str) -> dict[str, Any]:
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            st = self.ctl("status", job, "--json", timeout_s=30)
            if st.returncode == 0:
                return dict(json.loads(st.stdout))
        return {}

    def sigterm(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def finish_stop(self) -> None:
        """After ``sigterm``: wait, then SIGABRT (faulthandler dumps the threads), then SIGKILL."""
        if self.proc is None:
            return
        try:
            self.proc.wait(DAEMON_SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            self.shutdown_hung = True
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def lines(self, levels: tuple[str, ...] = ()) -> list[str]:
        try:
            text = self.err.read_text(errors="replace")
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            if levels:
                try:
                    if json.loads(line).get("level") not in levels:
                        continue
                except ValueError:
                    pass  # not JSON (a traceback, a faulthandler dump): keep it
            out.append(line)
        return out


@contextlib.contextmanager
def running(daemons: list[Daemon], ready_s: float = 60.0) -> Iterator[list[Daemon]]:
    """``daemons`` started and ready; stopped (SIGTERM, then the escalation of ``finish_stop``)
    on the way out, whatever happened."""
    try:
        for daemon in daemons:
            daemon.start()
        for daemon in daemons:
            daemon.wait_ready(time.monotonic() + ready_s)
        yield daemons
    finally:
        for daemon in daemons:
            if daemon.proc is not None:
                daemon.sigterm()
        for daemon in daemons:
            daemon.finish_stop()


def first_event(daemon: Daemon, event: str, after: float, **match: Any) -> float | None:
    """Seconds from ``after`` to the daemon's first ``event`` record (with ``match``) logged after it."""
    for line in daemon.lines():
        try:
            rec = json.loads(line)
            if rec.get("event") != event or any(rec.get(k) != v for k, v in match.items()):
                continue
            at = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, AttributeError):
            continue
        if at >= after:
            return at - after
    return None
