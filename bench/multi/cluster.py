"""What every trial of bench_multi shares: the temp dir, the environment, one etcd started by the
bench (and its CPU use), and the daemons started so far."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import psutil

from elasticd.etcd.embedded import EmbeddedEtcd
from multi.daemon import Daemon


class Cluster:
    """The bench's shared state; ``multi.scenarios`` and the launchers' trials build on it."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.bin = Path(ns.bin)
        self.python = str(self.bin / "python")
        self.tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-multi-"))
        self.tag = "bm-" + self.tmp.name.removeprefix("elasticd-bench-multi-")
        self.base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("ELASTICD_", "TORCHELASTIC_"))
        }
        self.base_env |= {
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",
            # jobs run the submitter's `python`: make it the venv's (as with an activated venv)
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.etcd: EmbeddedEtcd | None = None
        self.etcd_endpoint = ""
        self.seq = 0
        self.node_ids: list[str] = []
        self.daemons: list[Daemon] = []  # every daemon started (for the warnings at the end)
        self.shutdown_hung: list[str] = []
        self.etcd_cpu_mark: tuple[float, float] | None = None

    @property
    def markers(self) -> list[str]:
        return [str(self.tmp), *self.node_ids]

    def start_etcd(self) -> None:
        self.etcd = EmbeddedEtcd(self.tmp / "etcd")
        self.etcd.start()
        self.etcd_endpoint = self.etcd.endpoint

    def stop_etcd(self) -> None:
        if self.etcd is not None:
            self.etcd.stop()

    def trial_dir(self, scenario: str, variant: str, launcher: str, index: int) -> tuple[Path, Path]:
        self.seq += 1
        d = self.tmp / "trials" / f"{self.seq:03d}-{scenario}-{variant}-{launcher}-{index}"
        out = d / "out"
        out.mkdir(parents=True)
        return d, out

    def etcd_cpu_since(self, mark: tuple[float, float]) -> float | None:
        """etcd's CPU (% of one core) since ``mark`` (time, cpu seconds)."""
        now = self.etcd_cpu_now()
        if now is None or now[0] <= mark[0]:
            return None
        return round(100 * (now[1] - mark[1]) / (now[0] - mark[0]), 1)

    def etcd_cpu_now(self) -> tuple[float, float] | None:
        proc = getattr(self.etcd, "_proc", None)
        if proc is None:
            return None
        try:
            t = psutil.Process(proc.pid).cpu_times()
        except psutil.Error:
            return None
        return time.monotonic(), t.user + t.system
