"""The daemon's own lifecycle: embedded etcd, the node lease, clean and unclean stops, recovery."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from elasticd.etcd.client import EtcdClient
from tests.conftest import DaemonFactory
from tests.support import PYTHON, REPO, EtcdServer, wait_for

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_embedded_etcd_default_and_clean_sigterm(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory(None, "--slots", "2", "--lease-ttl", "30", embedded=True)
    ping = d.call("ping")
    assert ping["embedded_etcd"] is True
    endpoint = ping["etcd"][0]
    assert endpoint.startswith("unix:/")
    etcd_procs = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(d.state_dir / "etcd") in " ".join(p.info["cmdline"] or [])
    ]
    assert len(etcd_procs) == 1
    client = EtcdClient([endpoint])
    record = client.get_json(f"/elasticd/v6/nodes/{d.node_id}")
    assert record["node"] == d.node_id and record["inventory"]["kind"] == "cpu" and record["free_slots"] == 2

    env = dict(os.environ, OUT=str(tmp_path))
    job_id = d.ctl("submit", "--nproc-per-node", "2", str(SCRIPTS / "forky.py"), env=env).stdout.split()[0]
    wait_for(lambda: (tmp_path / "pids.1").exists() and (tmp_path / "pids.0").exists(), 30)
    wait_for(lambda: (tmp_path / "pids.1").read_text() and (tmp_path / "pids.0").read_text(), 5)
    pids = [int(x) for r in (0, 1) for x in (tmp_path / f"pids.{r}").read_text().split()]

    assert d.stop(30) == 0
    assert not [p for p in pids if alive(p)]
    assert not etcd_procs[0].is_running() or etcd_procs[0].status() == psutil.STATUS_ZOMBIE
    assert not d.socket.exists()
    assert d.events("lease.revoked") and d.events("daemon.stopped")
    for line in d.log_text().splitlines():  # JSON lines when stderr is not a TTY
        assert "event" in json.loads(line)
    client.close()

    # A clean stop drains the node: the single-node job waits for it (no restart spent), and the
    # restarted daemon, reusing its embedded etcd's data, picks the job up again.
    d.start()
    job = d.wait_state(job_id, ("RUNNING",), 20)
    assert job["restarts"] == 0 and job["round"] == 1
    assert d.ctl("kill", job_id).returncode == 0


def test_lease_revoked_on_stop_and_expires_after_kill9(
    daemon_factory: DaemonFactory, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    client = EtcdClient([etcd_server.endpoint])
    a = daemon_factory(None, "--lease-ttl", "3")
    b = daemon_factory(None, "--lease-ttl", "3")
    assert client.get(a.node_key()) and client.get(b.node_key())
    nodes = {n["node"] for n in a.call("nodes")["nodes"]}
    assert {a.node_id, b.node_id} <= nodes

    t0 = time.monotonic()
    a.stop()
    assert client.get(a.node_key()) is None  # revoked, not left to expire
    assert time.monotonic() - t0 < 3

    env = dict(os.environ, OUT=str(tmp_path))
    job_id = b.ctl("submit", "--nproc-per-node", "2", str(SCRIPTS / "forky.py"), env=env).stdout.split()[0]
    wait_for(
        lambda: all(
            (tmp_path / f"pids.{r}").exists() and (tmp_path / f"pids.{r}").read_text() for r in (0, 1)
        ),
        30,
    )
    pids = [int(x) for r in (0, 1) for x in (tmp_path / f"pids.{r}").read_text().split()]
    t0 = time.monotonic()
    b.kill9()
    # Workers die with the daemon (parent-death signal); their children, even the one that
    # escaped into its own session, are killed by the reaper sidecar.
    wait_for(lambda: not [p for p in pids if alive(p)], 5, what="workers and grandchildren to die")
    wait_for(lambda: client.get(b.node_key()) is None, 3 + 2, what="the lease to expire")
    assert time.monotonic() - t0 < 3 + 2
    assert not b.leftovers()

    # The next start counts the lost node as a failure of the job (one restart of its budget)
    # and, the node being back, runs the job again.
    b.start()
    job = b.wait_state(job_id, ("RUNNING",), 15)
    assert job["restarts"] == 1 and job["round"] == 1
    assert b.events("recover.job")[0]["action"] == "restart"
    b.ctl("kill", job_id)
    nodes = b.call("nodes")["nodes"]
    assert nodes[0]["free_slots"] == nodes[0]["slots"]
    client.close()


def test_recovery_kills_what_a_crashed_daemon_and_its_reaper_left(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None)
    env = dict(os.environ, OUT=str(tmp_path))
    job_id = d.ctl("submit", str(SCRIPTS / "forky.py"), env=env).stdout.split()[0]
    wait_for(lambda: (tmp_path / "pids.0").exists() and (tmp_path / "pids.0").read_text(), 30)
    (tmp_path / "pids.0").rename(tmp_path / "first.0")  # the restarted job writes its own
    pids = [int(x) for x in (tmp_path / "first.0").read_text().split()]
    assert d.proc is not None
    reaper = [
        p
        for p in psutil.Process(d.proc.pid).children()
        if "elasticd.workers.proctree.reaper" in " ".join(p.cmdline())
    ]
    assert len(reaper) == 1
    # Freeze the worker tree so the parent-death signal cannot act, kill the reaper, then the daemon.
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    reaper[0].kill()
    d.kill9()
    time.sleep(0.5)
    assert any(alive(p) for p in pids[1:])  # the grandchildren survived the crash
    d.start()
    wait_for(lambda: not [p for p in pids if alive(p)], 10, what="recovery to kill the leftovers")
    assert d.events("recover.killing")
    assert d.wait_state(job_id, ("RUNNING",), 15)["restarts"] == 1
    d.ctl("kill", job_id)


def test_one_daemon_per_state_dir_and_per_socket(daemon_factory: DaemonFactory) -> None:
    first = daemon_factory(None)
    twin = daemon_factory(first.node_id, start=False)
    twin.root = first.root  # same state dir and socket
    twin.stderr_path = first.root / "twin.log"
    twin.start(wait=False)
    assert twin.proc is not None and twin.proc.wait(30) == 2
    assert "another elasticd is running" in twin.log_text()
    other = daemon_factory(None, "--socket", str(first.socket), start=False)
    other.start(wait=False)
    assert other.proc is not None and other.proc.wait(30) == 2
    assert "already listening" in other.log_text()
    assert first.call("ping")["node"] == first.node_id


def _output_on_a_tty(tmp_path: Path) -> bytes:
    """What a daemon that cannot reach etcd writes on a terminal, up to its first ``etcd.waiting``."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "elasticd",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path / "st"),
            "--etcd-endpoints",
            "127.0.0.1:1",
            "--log-format",
            "auto",
        ],
        stdout=slave,
        stderr=slave,
        env=dict(os.environ, ELASTICD_LEASE_TTL="5"),
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 10
    while b"etcd.waiting" not in output and time.monotonic() < deadline:
        try:
            output += os.read(master, 4096)
        except OSError:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    os.close(master)
    return output


def _node_id_of_a_config_file(tmp_path: Path) -> str:
    """The node id a daemon settles on with ``node_id`` in its file and ``ELASTICD_NODE_ID`` set."""
    good = tmp_path / "good.toml"
    good.write_text(
        f'node_id = "from-file"\nsocket = "{tmp_path / "g.sock"}"\nstate_dir = "{tmp_path / "gst"}"\n'
        f'etcd_endpoints = ["127.0.0.1:1"]\n'
    )
    proc = subprocess.Popen(
        [PYTHON, "-m", "elasticd", "--config", str(good), "--log-format", "json"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, ELASTICD_NODE_ID="from-env"),
    )
    memo = tmp_path / "gst" / "node_id"
    try:  # the node id is settled (env beats file) before etcd is even tried
        wait_for(lambda: memo.exists() and memo.read_text().strip(), 30, 0.05, "the node id to be written")
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    return memo.read_text().strip()


def test_console_logs_on_a_tty_and_bad_config_exit_2(tmp_path: Path) -> None:
    output = _output_on_a_tty(tmp_path)
    first = output.decode(errors="replace").splitlines()[0]
    assert "etcd.waiting" in output.decode() and not first.lstrip().startswith("{")

    bad = tmp_path / "bad.toml"
    bad.write_text('lease_ttl = "soon"\n')
    res = subprocess.run(
        [PYTHON, "-m", "elasticd", "--config", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2 and "lease_ttl" in res.stderr
    res = subprocess.run(
        [PYTHON, "-m", "elasticd", "--config", str(tmp_path / "missing.toml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and "not found" in res.stderr
    assert _node_id_of_a_config_file(tmp_path) == "from-env"
