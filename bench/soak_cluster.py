"""The soak's cluster: one real etcd, N daemons on it, the job, and what the job's progress log says.

Built on the test suite's own support code (``tests/support.py``: ``EtcdServer``, ``DaemonProc``,
``wait_for``), so the soak starts etcd and daemons exactly as the integration tests do: loopback,
free ports, a temp data dir, one node id, socket, state dir and log dir per daemon. The daemons
talk to etcd through the client ``etcd_client`` names (``--etcd-client``: gateway or grpc; mixed:
the daemons alternate, the first on the gateway, as the test suite's ``tests/etcd_clients.py``
has them); the soak's own reads of etcd (keys left, the round) go through the gateway.

With ``netns`` (root, ``tests/netns.py``), each daemon runs in a network namespace of its own on a
bridge, etcd listens on the bridge, the daemons reach it through a delaying relay
(``tests/netfaults.DelayProxy``, pass-through until a fault slows it) and gloo talks over the
namespaces' ``eth0``: the network between them can then be cut (``Cluster.faults``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from elasticd.etcd.client import EtcdClient  # noqa: E402
from elasticd.workers.proctree import tree as proctree  # noqa: E402
from tests.etcd_clients import ClientPolicy  # noqa: E402
from tests.netfaults import DelayProxy, Faults  # noqa: E402
from tests.netns import IFNAME, BridgeEtcd, NetnsDaemon, Topology  # noqa: E402
from tests.support import PYTHON, DaemonProc, EtcdServer, unique  # noqa: E402

JOB_SCRIPT = REPO / "bench" / "soak_job.py"


@dataclass(frozen=True)
class Step:
    """One line of the job's progress log: a step rank 0 completed."""

    step: int
    world: int
    round: int
    at: float  # wall clock


@dataclass(frozen=True)
class JobSettings:
    nnodes: str = "2:3"
    max_restarts: int = 1000
    stop_grace_s: float = 5.0
    last_call_s: float = 1.0
    every: int = 25  # the disk checkpoint interval, in steps, without snapshots
    step_time_s: float = 0.05
    hang_timeout_s: float | None = None  # None: submit has no --hang-timeout
    snapshots: bool = True  # a memory snapshot after every step (the daemons keep them)

    @property
    def interval(self) -> int:
        """Steps between two commits: what a crash may have to redo."""
        return 1 if self.snapshots else self.every


@dataclass(frozen=True)
class LifeLine:
    """One line a worker wrote about itself (``soak_job.Life``): start, alive or step."""

    pid: int
    what: str
    round: int
    rank: int
    node: str
    at: float  # wall clock


def read_lives(out: Path) -> list[LifeLine]:
    """Every worker's life lines, from ``DIR/lives/<pid>`` (a torn last line is skipped)."""
    found = []
    for path in sorted((out / "lives").glob("*")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[0] in ("start", "alive", "step"):
                try:
                    found.append(LifeLine(int(path.name), parts[0], int(parts[1]), int(parts[2]), parts[3],
                                          float(parts[4])))  # fmt: skip
                except ValueError:
                    continue
    return found


class Progress:
    """Tails ``progress``: every step rank 0 reported, in the order it reported them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[Step] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[Step]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.steps
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            parts = line.split()
            if len(parts) == 4:
                self.steps.append(Step(int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])))
        return self.steps

    def last(self) -> Step | None:
        steps = self.poll()
        return steps[-1] if steps else None


class Cluster:
    def __init__(
        self,
        root: Path,
        nodes: int,
        ttl_s: float,
        daemon_stop_grace_s: float,
        netns: bool = False,
        etcd_client: str = "gateway",
        snapshot_bytes: int = 0,
    ) -> None:
        self.root = root
        self.etcd_client = etcd_client  # gateway, grpc or mixed (the soak's own reads use the gateway)
        self.snapshot_bytes = snapshot_bytes  # the daemons' bound on a job's memory snapshots (0: off)
        self.ttl_s = ttl_s
        self.n_nodes = nodes
        self.grace_s = daemon_stop_grace_s
        self.etcd: EtcdServer = EtcdServer(root / "etcd", name="soak")
        self.topology: Topology | None = Topology(n_hosts=nodes) if netns else None
        self.proxy: DelayProxy | None = None
        self.faults: Faults | None = None
        self.prefix = f"/soak/{unique('p')}"
        self.out = root / "job"
        self.tag = tag = unique("soak")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICD_")}
        env |= {
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": IFNAME if netns else "lo",
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
        }
        self.env = env
        self.daemons: list[DaemonProc] = []
        if not netns:
            self.daemons = [
                DaemonProc(
                    f"{tag}-{i}", root / f"node{i}", self._args(self.etcd.endpoint, "127.0.0.1", i), env
                )
                for i in range(nodes)
            ]
        self.frozen: set[int] = set()  # daemons under SIGSTOP: do not talk to them
        self.progress = Progress(self.out / "progress")
        self.job_id = ""

    @property
    def node_ids(self) -> list[str]:
        return [d.node_id for d in self.daemons]

    def markers(self) -> list[str]:
        """What our processes carry on their command lines (bench_single.own_processes)."""
        return [str(self.root), *self.node_ids]

    def client_of(self, i: int) -> str:
        """Daemon ``i``'s ``--etcd-client``."""
        return ClientPolicy(self.etcd_client, self.etcd_client).client(i)

    def _args(self, endpoint: str, address: str, i: int) -> list[str]:
        return [
            "--etcd-endpoints", endpoint, "--etcd-prefix", self.prefix,
            "--address", address, "--lease-ttl", str(self.ttl_s), "--slots", "2",
            "--stop-grace", str(self.grace_s), "--etcd-client", self.client_of(i),
            "--snapshot-bytes", str(self.snapshot_bytes),
        ]  # fmt: skip

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.topology is not None:
            self._start_netns(self.topology)
        else:
            self.etcd.start()
        for d in self.daemons:
            d.start()

    def _start_netns(self, topo: Topology) -> None:
        topo.create()
        # A test that has to kill the soak removes the namespaces and bridge by this tag.
        print(f"soak: daemons in network namespaces, netns tag={topo.tag}", flush=True)
        self.faults = Faults(topo)
        self.etcd = BridgeEtcd(self.root / "etcd", topo.gateway, name="soak")
        self.etcd.start()
        self.proxy = DelayProxy((topo.gateway, 0), (topo.gateway, self.etcd.client_port))
        self.proxy.start()
        for host in topo.hosts:
            args = self._args(self.proxy.endpoint, host.address, host.index)
            node = f"{self.tag}-{host.index}"
            self.daemons.append(
                NetnsDaemon(node, self.root / f"node{host.index}", args, self.env, netns=host.netns)
            )

    def running(self, i: int) -> bool:
        proc = self.daemons[i].proc
        return proc is not None and proc.poll() is None

    def usable(self, exclude: int | None = None) -> list[DaemonProc]:
        return [
            d for i, d in enumerate(self.daemons) if i != exclude and i not in self.frozen and self.running(i)
        ]

    def shutdown(self) -> None:
        """SIGCONT whatever is frozen, heal the network, stop every daemon (SIGTERM, then SIGKILL),
        then etcd (and the namespaces, the relay)."""
        for i in sorted(self.frozen):
            self.cont(i)
        if self.faults is not None:
            with contextlib.suppress(Exception):
                self.faults.heal()
        if self.proxy is not None:
            self.proxy.delay_s = 0.0
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop(30)
        with contextlib.suppress(Exception):
            self.etcd.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.topology is not None:
            self.topology.destroy()  # also kills anything still inside the namespaces

    def freeze(self, i: int) -> None:
        proc = self.daemons[i].proc
        assert proc is not None
        self.frozen.add(i)
        os.kill(proc.pid, signal.SIGSTOP)

    def cont(self, i: int) -> None:
        proc = self.daemons[i].proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        self.frozen.discard(i)

    # -- the job ------------------------------------------------------------------------------
    def submit(self, s: JobSettings) -> str:
        argv = [
            "submit", "--nnodes", s.nnodes, "--nproc-per-node", "1",
            "--max-restarts", str(s.max_restarts), "--stop-grace", str(s.stop_grace_s),
            "--last-call", str(s.last_call_s), "--python", PYTHON, "--cwd", str(self.out),
            "--env", f"SOAK_OUT={self.out}", "--name", "soak",
            *(["--hang-timeout", str(s.hang_timeout_s)] if s.hang_timeout_s is not None else []),
            str(JOB_SCRIPT), "--", "--every", str(s.every), "--step-time", str(s.step_time_s),
            *(["--snapshots"] if s.snapshots else []),
        ]  # fmt: skip
        res = self.daemons[0].ctl(*argv, env=self.env)
        if res.returncode != 0:
            raise RuntimeError(f"submit failed ({res.returncode}): {res.stderr.strip()}")
        self.job_id = res.stdout.splitlines()[0].strip()
        return self.job_id

    def status(self, exclude: int | None = None) -> dict[str, Any] | None:
        """The job's status from the first daemon that answers; None if none does."""
        for d in self.usable(exclude):
            try:
                return dict(d.call("status", timeout_s=3, job=self.job_id)["job"])
            except Exception:
                continue
        return None

    def worker_pids(self, i: int) -> list[int]:
        """The pids node ``i`` reports for the job's workers (the job's status, members' pids)."""
        view = self.status()
        for m in (view or {}).get("members", []):
            if m.get("node") == self.node_ids[i]:
                return [int(p) for p in m.get("pids", [])]
        return []

    def live_workers(self, i: int) -> list[psutil.Process]:
        """Node ``i``'s live workers of the job: its marked processes that keep a life line."""
        lives = self.out / "lives"
        return [p for p in proctree.marked(self.node_ids[i]) if (lives / str(p.pid)).exists()]

    def ctl(self, *argv: str, exclude: int | None = None) -> tuple[int, str]:
        """``elasticctl`` through the first usable daemon other than ``exclude``."""
        for d in self.usable(exclude):
            res = d.ctl(*argv, timeout_s=60, env=self.env)
            return res.returncode, (res.stdout + res.stderr).strip()
        return -1, "no daemon to talk to"

    def set_finish(self, total_steps: int) -> None:
        tmp = self.out / ".finish.tmp"
        tmp.write_text(f"{total_steps}\n")
        os.replace(tmp, self.out / "finish")

    def request_hang(self, rank: int) -> None:
        (self.out / f"hang.{rank}").touch()

    # -- etcd ---------------------------------------------------------------------------------
    def etcd_keys(self) -> list[str]:
        client = EtcdClient([self.etcd.endpoint], self.etcd.client_auth(), timeout_s=5)
        try:
            return sorted(kv.key for kv in client.get_prefix(self.prefix + "/"))
        finally:
            client.close()


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.1) -> Any:
    """``predicate()``'s first truthy value, or None after ``timeout_s`` (no exception: a fault
    that does not recover is a result, not a crash of the soak)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)
