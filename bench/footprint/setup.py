"""What bench_footprint measures: etcd and one daemon in a temp dir, and a job to run on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.paths import REPO

SLEEPER = REPO / "tests" / "scripts" / "sleeper.py"


class Setup:
    """etcd + one daemon in a temp dir; ``close`` stops both (and the job, if any)."""

    def __init__(self, tmp: Path, extra: list[str]) -> None:
        from elasticd.etcd.embedded import EmbeddedEtcd

        self.tmp = tmp
        self.socket = tmp / "ctl.sock"
        self.etcd = EmbeddedEtcd(tmp / "etcd")
        self.etcd.start()
        self.env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        argv = [
            sys.executable, "-m", "elasticd",
            "--socket", str(self.socket),
            "--state-dir", str(tmp / "state"),
            "--log-dir", str(tmp / "logs"),
            "--node-id", "bench-footprint",
            "--etcd-endpoints", self.etcd.endpoint,
            "--log-format", "json",
            "--allow-root-jobs",
            "--slots", "2",
            *extra,
        ]  # fmt: skip
        self.log = tmp / "daemon.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=err, stderr=err, env=self.env, cwd=tmp)

    def ctl(self, *argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = self.env | {"ELASTICD_SOCKET": str(self.socket)}
        return subprocess.run(
            [sys.executable, "-m", "elasticctl", *argv],
            capture_output=True, text=True, timeout=timeout_s, env=env, cwd=self.tmp,
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        from elasticctl.client import Client

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"elasticd exited with {self.proc.returncode}:\n{self.tail()}")
            client = Client(self.socket, timeout_s=0.5)
            try:
                client.call("ping")
                return
            except Exception:
                time.sleep(0.1)
            finally:
                client.close()
        raise RuntimeError(f"elasticd did not answer within {timeout_s} s:\n{self.tail()}")

    def reaper(self) -> Any:
        import psutil

        for child in psutil.Process(self.proc.pid).children():
            if "elasticd.workers.proctree.reaper" in " ".join(child.cmdline()) or "reaper" in child.name():
                return child
        raise RuntimeError("the daemon has no reaper child")

    def job_state(self, job: str) -> str:
        from elasticctl.client import Client

        client = Client(self.socket, timeout_s=10)
        try:
            return str(client.call("status", job=job)["job"]["state"])
        finally:
            client.close()

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.etcd.stop()


def start_job(setup: Setup) -> str:
    """Submit the sleeper; its job id once it runs."""
    res = setup.ctl("submit", "--nproc-per-node", "1", str(SLEEPER))
    if res.returncode != 0:
        raise RuntimeError(f"submit failed: {res.stderr}")
    job = res.stdout.split()[0]
    deadline = time.monotonic() + 60
    while (state := setup.job_state(job)) != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} is {state}, not RUNNING, after 60 s:\n{setup.tail()}")
        time.sleep(0.2)
    return job
