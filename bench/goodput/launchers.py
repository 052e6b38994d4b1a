"""The two launchers of bench_goodput: torchrun (also for the calibration run) and elasticd's
daemons with their etcd (one, or two for the node kill)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from harness.paths import REPO

from elasticd.workers.proctree import tree as proctree
from goodput.figures import Calib, interval
from tests.support import PYTHON, DaemonProc, EtcdServer, unique

JOB = REPO / "bench" / "goodput_job.py"
RESTARTS = "10000"  # elasticd's most
NODE_DOWN_S = 1.0  # a node killed is back (its daemon started again) after this


def job_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")


def job_args(ns: argparse.Namespace, out: Path, every: int) -> list[str]:
    return [str(JOB), "--out", str(out), "--every", str(every), "--hidden", str(ns.hidden),
            "--batch", str(ns.batch)]  # fmt: skip


def torchrun(argv: list[str], out: Path) -> subprocess.Popen[bytes]:
    log = open(out / "launcher.log", "ab")  # noqa: SIM115 (the child holds it)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", RESTARTS, "--monitor-interval", "0.1", *argv]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=job_env(), cwd=out, start_new_session=True)
    log.close()
    return proc


def calibrate(ns: argparse.Namespace, root: Path) -> Calib:
    out = root / "calibrate"
    out.mkdir()
    proc = torchrun([*job_args(ns, out, 1), "--calibrate", "40"], out)
    if proc.wait(300) != 0:
        raise SystemExit(f"calibration failed: {(out / 'launcher.log').read_text()[-3000:]}")
    c = json.loads((out / "calib.json").read_text())
    return Calib(c["step_s"], c["save_s"], int(c["state_bytes"]), interval(c["save_s"], c["step_s"]))


class Elasticd:
    """The daemons (1, or 2 for the node kill: one rank each) and their etcd, for every elasticd trial."""

    def __init__(self, root: Path, nodes: int) -> None:
        self.root = root
        self.node_ids = [unique("goodput") for _ in range(nodes)]
        self.etcd = EtcdServer(root / "etcd")
        self.daemons: list[DaemonProc] = []

    def start(self) -> None:
        self.etcd.start()
        flags = ["--etcd-endpoints", self.etcd.endpoint, "--etcd-prefix", f"/b/{unique('p')}",
                 "--slots", "2", "--snapshot-bytes", str(512 << 20), "--address", "127.0.0.1",
                 "--lease-ttl", "3"]  # fmt: skip
        for i, node in enumerate(self.node_ids):
            self.daemons.append(DaemonProc(node, self.root / f"node{i}", flags, dict(os.environ)))
            self.daemons[-1].start()

    def stop(self) -> None:
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop()
        self.etcd.stop()

    def launch(self, argv: list[str], out: Path) -> subprocess.Popen[bytes]:
        log = open(out / "launcher.log", "ab")  # noqa: SIM115 (the child holds it)
        n = len(self.daemons)
        shape = ["--nproc-per-node", "2"] if n == 1 else ["--nnodes", str(n), "--nproc-per-node", "1"]
        cmd = [PYTHON, "-m", "elasticctl", "submit", *shape, "--max-restarts", RESTARTS,
               "--max-same-failures", "0",
               "--cwd", str(out), "--follow", *argv[:1], "--", *argv[1:]]  # fmt: skip
        env = job_env() | {"ELASTICD_SOCKET": str(self.daemons[0].socket)}
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=out, start_new_session=True)
        log.close()
        return proc

    def goodput(self, since: float) -> dict[str, Any] | None:
        """elasticd's own figure (``status JOB``'s ``goodput``) for the job submitted after ``since``."""
        jobs = self.daemons[0].call("status")["jobs"]
        ours = [j for j in jobs if (j.get("submitted_at") or 0) >= since]
        if not ours:
            return None
        job = max(ours, key=lambda j: j["submitted_at"])
        view = self.daemons[0].call("status", job=job["id"])["job"]
        return dict(view["goodput"]) if view.get("goodput") else None

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` whole (its daemon, workers, keeper, zygote: as a power loss), then
        start its daemon again (same node id and state dir: the node back, empty)."""
        d = self.daemons[i]
        assert d.proc is not None
        procs = [psutil.Process(d.proc.pid)]
        with contextlib.suppress(psutil.Error):
            procs += procs[0].children(recursive=True)
        procs += proctree.marked(d.node_id)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        time.sleep(NODE_DOWN_S)
        d.start()
