"""``elasticrun``: a torchrun command line, unchanged, run by the local daemon; same results as
under torchrun, torchrun's exit statuses, and Ctrl-C stops the job as torchrun's does."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elasticd.netaddr import free_port
from tests.support import PYTHON, DaemonProc, alive_pid, hears_ctrl_c, log_events, unique, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(240), pytest.mark.slow]
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def elasticrun(d: DaemonProc, cwd: Path, *argv: str, env: dict[str, str] | None = None,
               timeout_s: float = 180) -> subprocess.CompletedProcess[str]:  # fmt: skip
    full = dict(os.environ) | (env or {}) | {"ELASTICD_SOCKET": str(d.socket)}
    cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full, cwd=cwd)


def torchrun(cwd: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed next to this python")
    full = dict(os.environ) | env
    return subprocess.run(
        [str(TORCHRUN), *argv], capture_output=True, text=True, timeout=180, env=full, cwd=cwd
    )


def contracts(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("contract.*.json"))]


@pytest.mark.parametrize(
    "line",
    [
        ["--standalone", "--nproc-per-node", "2"],
        ["--nnodes=1", "--nproc_per_node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29400",
         "--max_restarts=0", "--monitor-interval=1", "--start-method=spawn", "--role=trainer", "--tee=3"],
        ["--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", "/tmp/not-used", "-r", "3"],
    ],
)  # fmt: skip
def test_a_torchrun_line_gives_the_same_contract_under_elasticrun(
    daemon: DaemonProc, tmp_path: Path, line: list[str]
) -> None:
    """The line under torchrun once (the anchor), then under elasticrun warm and cold."""
    argv = [*line, str(SCRIPTS / "launcher_contract.py"), "--lr", "0.1"]
    (tmp_path / "torchrun").mkdir()
    res = torchrun(tmp_path, *argv, env={"OUT": str(tmp_path / "torchrun")})
    assert res.returncode == 0, ("torchrun", res.stderr[-3000:])
    under_torchrun = contracts(tmp_path / "torchrun")
    assert len(under_torchrun) == 2 and {c["use_agent_store"] for c in under_torchrun} == {"True"}
    for mode in ("warm", "cold"):
        out = tmp_path / mode
        out.mkdir()
        flags = ["--no-warm"] if mode == "cold" else []
        res = elasticrun(daemon, tmp_path, *flags, *argv, env={"OUT": str(out)})
        assert res.returncode == 0, (mode, res.stderr[-3000:])
        under_elasticrun, anchor = contracts(out), [dict(c) for c in under_torchrun]
        if mode == "cold":  # no warm parent to fork a store host from: rank 0 hosts it (jobs.agentstore)
            assert {c.pop("use_agent_store") for c in under_elasticrun} == {"False"}
            for c in anchor:
                c.pop("use_agent_store")
        assert under_elasticrun == anchor, mode
        assert all(c["is_torchelastic_launched"] and c["sum_of_ranks"] == 1 for c in under_elasticrun)
    assert [e["mode"] for e in log_events(daemon, "group.spawned")] == ["warm", "cold"]


def test_a_snapshotting_ddp_trainer_recovers_to_the_weights_of_a_clean_torchrun(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    """A clean run under torchrun once (the anchor); under elasticrun, warm and cold, rank 1
    crashes once and the job resumes from its snapshot (one restart) to the same weights."""
    script = str(SCRIPTS / "ddp_checkpoint.py")
    (tmp_path / "torchrun").mkdir()
    res = torchrun(
        tmp_path, "--standalone", "--nproc_per_node=2", script,
        env={"OUT": str(tmp_path / "torchrun"), "CRASH_STEP": "-1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    clean = json.loads((tmp_path / "torchrun" / "result.json").read_text())
    for mode in ("warm", "cold"):
        crashed = tmp_path / mode
        crashed.mkdir()
        flags = ["--no-warm"] if mode == "cold" else []
        res = elasticrun(daemon, tmp_path, *flags, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                         script, env={"OUT": str(crashed), "CRASH_STEP": "12"})  # fmt: skip
        assert res.returncode == 0, (mode, res.stderr[-3000:])
        b = json.loads((crashed / "result.json").read_text())
        flat = [[w for layer in r["weights"] for w in layer] for r in (clean, b)]
        assert b["attempt"] == 1 and flat[0] == pytest.approx(flat[1], abs=1e-6), mode
    assert [e["mode"] for e in log_events(daemon, "group.spawned")] == ["warm", "warm", "cold", "cold"]


def test_a_failed_job_exits_1_and_a_refused_flag_2_with_its_reason(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    res = elasticrun(daemon, tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "fail_rank.py"),
                     env={"OUT": str(tmp_path)})  # fmt: skip
    assert res.returncode == 1 and "FAILED" in res.stderr
    res = elasticrun(daemon, tmp_path, "--virtual-local-rank", str(SCRIPTS / "sleeper.py"))
    assert res.returncode == 2 and "--virtual-local-rank is not supported" in res.stderr
    res = elasticrun(daemon, tmp_path, "--nproc-per-node", "lots", str(SCRIPTS / "sleeper.py"))
    assert res.returncode == 2 and "positive number, gpu, cpu or auto" in res.stderr


def test_ctrl_c_stops_the_job_and_every_worker(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ) | {"ELASTICD_SOCKET": str(daemon.socket)}
    cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())",
           "--nproc-per-node", "2", str(SCRIPTS / "sleeper.py")]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True, preexec_fn=hears_ctrl_c
    )
    try:
        jobs = wait_for(lambda: [j for j in daemon.call("status")["jobs"] if len(j.get("pids") or ()) == 2],
                        60, 0.1, "the job's two workers")  # fmt: skip
        pids = jobs[0]["pids"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert daemon.job(jobs[0]["id"])["state"] == "KILLED"
    assert not [p for p in pids if alive_pid(p)]


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_master_port_is_where_the_ranks_store_listens(daemon: DaemonProc, tmp_path: Path, mode: str) -> None:
    """torchrun's agent hosts the store on --master-port; so does elasticrun (warm: the job's store
    host, every rank a client; cold: rank 0), and a script that dials that port itself runs."""
    port = free_port()
    cold = ["--no-warm"] if mode == "cold" else []
    line = ["--nnodes=1", "--nproc-per-node=2", "--master-addr=localhost", f"--master-port={port}"]
    line += [str(SCRIPTS / "master_port.py"), str(port)]
    res = elasticrun(daemon, tmp_path, *cold, *line, timeout_s=120)
    assert res.returncode == 0, res.stdout + res.stderr
    store = "True" if mode == "warm" else "False"
    assert f"rank 0 sum 3.0 agent_store={store}" in res.stdout, res.stdout
    assert f"rank 1 sum 3.0 agent_store={store}" in res.stdout, res.stdout
    assert "--master-port: not needed" not in res.stderr


def test_master_port_on_two_nodes_is_where_the_leaders_store_listens(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """One line per node (an sbatch script's): the ranks of both reach the store on the named port
    of group rank 0's node (here both nodes are this host: localhost is the leader's)."""
    a, b = (daemon_factory(unique(n), "--slots", "2") for n in ("a", "b"))
    port, job = free_port(), unique("exp")
    argv = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-id", job, f"--master-port={port}",
            str(SCRIPTS / "master_port.py"), str(port)]  # fmt: skip
    procs = []
    for d in (a, b):
        env = dict(os.environ) | {"ELASTICD_SOCKET": str(d.socket)}
        cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())", *argv]
        pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        procs.append(subprocess.Popen(cmd, env=env, cwd=tmp_path, **pipes))
    try:
        outs = [p.communicate(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    assert [p.returncode for p in procs] == [0, 0], outs
    sums = sorted(m for out, _ in outs for m in re.findall(r"rank \d sum [\d.]+", out))
    assert sums == ["rank 0 sum 3.0", "rank 1 sum 3.0"], outs
    assert a.job(job)["state"] == "SUCCEEDED"


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_a_master_port_in_use_fails_the_job_at_once_saying_so(
    daemon: DaemonProc, tmp_path: Path, mode: str
) -> None:
    cold = ["--no-warm"] if mode == "cold" else []
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        res = elasticrun(daemon, tmp_path, *cold, "--nproc-per-node=2", f"--master-port={port}",
                         str(SCRIPTS / "master_port.py"), str(port), timeout_s=60)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"--master-port {port} " in res.stderr, res.stderr
    (job,) = [j for j in daemon.call("status")["jobs"] if j["state"] == "FAILED"]
    ended = daemon.job(job["id"])
    assert (ended["code"], ended["restarts"]) == ("spawn_failed", 0), ended
    assert "sum" not in res.stdout  # no rank ran


STUBBORN = """\
import os, pathlib, signal, time
out = pathlib.Path(os.environ["OUT"])
signal.signal(signal.SIGTERM, lambda *_: (out / f"term.{os.environ['RANK']}").write_text(""))
(out / f"up.{os.environ['RANK']}").write_text("")
while True:
    time.sleep(1)
"""


def test_signals_while_the_job_stops_change_nothing_and_print_no_traceback(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    """``timeout`` sends SIGTERM to elasticrun and to its process group at once; more come while
    the daemon's kill waits out the workers' grace (they ignore SIGTERM): each is told, and the
    stop goes on as the first asked."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    env = dict(os.environ) | {"ELASTICD_SOCKET": str(daemon.socket), "OUT": str(tmp_path)}
    cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())",
           "--shutdown-timeout", "15", str(script)]  # fmt: skip
    alone: dict[str, Any] = {"start_new_session": True, "preexec_fn": hears_ctrl_c}
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True, **alone)
    try:
        wait_for((tmp_path / "up.0").exists, 60, 0.05, "the worker to start")
        os.kill(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGTERM)
        wait_for((tmp_path / "term.0").exists, 30, 0.05, "the kill to reach the worker")
        os.kill(proc.pid, signal.SIGTERM)  # within the worker's grace: elasticrun still waits on its kill
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert proc.returncode == 130, err
    assert "SIGTERM: stopping job" in err and "Ctrl-C again: already stopping job" in err, err
    job = err.split("SIGTERM: stopping job ")[1].split()[0]
    assert daemon.job(job)["state"] == "KILLED"


def test_the_same_line_on_two_nodes_with_one_rdzv_id_makes_one_job(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """As in an sbatch script that runs one torchrun per node: both lines join one 2-node job."""
    a, b = (daemon_factory(unique(n), "--slots", "2") for n in ("a", "b"))
    job = unique("exp")
    argv = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-id", job, "--rdzv-backend", "c10d",
            str(SCRIPTS / "launcher_contract.py")]  # fmt: skip
    procs = []
    for d in (a, b):
        env = dict(os.environ) | {"ELASTICD_SOCKET": str(d.socket), "OUT": str(tmp_path)}
        cmd = [PYTHON, "-c", "import sys; from elasticctl.run import main; sys.exit(main())", *argv]
        procs.append(subprocess.Popen(cmd, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert any("joining job" in e for e in errs)  # the second line found the first one's job
    records = contracts(tmp_path)
    assert sorted(r["group_rank"] for r in records) == [0, 1] and {r["world_size"] for r in records} == {2}
    # the nodes agree (a join never waits for the zygote: round 0 may be rank 0-hosted)
    assert len({r["use_agent_store"] for r in records}) == 1
    assert a.job(job)["state"] == "SUCCEEDED"
