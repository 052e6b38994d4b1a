"""The port filter's cost at a round's start, through real daemons and in isolation.

- Daemons: two elasticd (embedded etcd each), one with ``--port-filter``, one without, and a
  two-rank job of a user made for the run (root's jobs are never filtered) on each in turn. The
  ranks are stdlib Python (the host's python3; torch under /root is not reachable by another
  user here): rank 0 hosts the store on ``MASTER_PORT``, each rank opens a listener and connects
  to its peer's and to the store, as gloo's pairs do, and stamps the time. Rendezvous: submit →
  both ranks exchanged. Restart: rank 1 exits 1 after a stamp → both ranks of attempt 1
  exchanged. Interleaved (on, off, on, ...), medians and the ratio on / off.
- Isolation: ``PortFilter.admit`` of a round whose members changed (a transaction), on through
  libnftables, on through ``nft -j``, off; and the rules per job as jobs and members grow.

Needs root, useradd and nft. ``--trials N`` (default 10)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import pwd
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.daemon import start_daemon
from harness.paths import default_bin

from elasticctl.client import Client
from elasticd.portfilter.guard import PortFilter
from elasticd.portfilter.libnft import NftLib
from elasticd.portfilter.nft import Nft, NftCli
from elasticd.portfilter.rules import Guard, Mode, commands, desired, rule_count

RANK = """
import os, socket, sys, time
here, rank = os.path.dirname(os.path.abspath(__file__)), int(os.environ["RANK"])
attempt, port = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["MASTER_PORT"])
if rank == 0:
    store = socket.create_server(("0.0.0.0", port), backlog=64)
mine = socket.create_server(("0.0.0.0", 0), backlog=64)
def put(name, text):
    open(os.path.join(here, name + ".tmp"), "w").write(text)
    os.rename(os.path.join(here, name + ".tmp"), os.path.join(here, name))
put(f"port.{attempt}.{rank}", str(mine.getsockname()[1]))
peer = os.path.join(here, f"port.{attempt}.{1 - rank}")
deadline = time.monotonic() + 60
while not os.path.exists(peer) and time.monotonic() < deadline:
    time.sleep(0.002)
for target in (int(open(peer).read()), port):
    while True:
        try:
            socket.create_connection(("127.0.0.1", target), timeout=5).close(); break
        except ConnectionRefusedError:
            time.sleep(0.01)
put(f"done.{attempt}.{rank}", repr(time.time()))
if attempt == 0 and rank == 1:
    while not os.path.exists(os.path.join(here, "kill")):
        time.sleep(0.002)
    put("killed", repr(time.time())); os._exit(1)
while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def as_user(uid: int, socket: Path, cmd: str, **args: Any) -> dict[str, Any]:
    """One request from a forked child dropped to ``uid`` (the daemon reads its peer's uid)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pwd.getpwuid(uid).pw_gid)
            os.setuid(uid)
            os.write(w, json.dumps(Client(socket, timeout_s=15).call(cmd, **args)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def wait(path: Path, timeout_s: float = 60) -> float:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.002)
    return float(path.read_text())


def trial(socket: Path, uid: int, root: Path, n: int) -> tuple[float, float]:
    """One job: (rendezvous s, restart s)."""
    work = root / f"w{n}"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    (work / "rank.py").write_text(RANK)
    args = {"entry_kind": "script", "entry": str(work / "rank.py"), "cwd": str(work),
            "python": "/usr/bin/python3", "env": {"PATH": "/usr/bin:/bin"}, "nproc_per_node": 2,
            "max_restarts": 1}  # fmt: skip
    t0 = time.time()
    job = as_user(uid, socket, "submit", **args)["id"]
    rdzv = max(wait(work / f"done.0.{r}") for r in (0, 1)) - t0
    (work / "kill").touch()
    killed = wait(work / "killed")
    restart = max(wait(work / f"done.1.{r}") for r in (0, 1)) - killed
    (work / "go").touch()
    client = Client(socket, timeout_s=15)
    deadline = time.monotonic() + 60
    while client.call("status", job=job)["job"]["state"] not in ("SUCCEEDED", "FAILED", "KILLED"):
        if time.monotonic() > deadline:
            raise TimeoutError(job)
        time.sleep(0.05)
    return rdzv, restart


def daemons(trials: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-pf-"))
    root.chmod(0o755)
    user = f"bpf{os.getpid() % 100000}"
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", user], check=True, timeout=20)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        uid = pwd.getpwnam(user).pw_uid
        env = dict(os.environ, ELASTICD_SOCKET_MODE="666")
        for mode in ("on", "off"):
            (root / mode).mkdir()
            flag = "--port-filter" if mode == "on" else "--no-port-filter"
            extra = [flag, "--address", "127.0.0.1"]
            procs[mode] = start_daemon(default_bin(), root / mode, socket=root / mode / "c.sock",
                                       node_id=f"pf-{mode}", stop_grace_s=5, env=env,
                                       err=root / mode / "daemon.log", extra=extra)  # fmt: skip
        for mode in procs:
            deadline = time.monotonic() + 60
            while not (root / mode / "c.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        times: dict[str, dict[str, list[float]]] = {m: {"rendezvous": [], "restart": []} for m in procs}
        for n in range(trials):
            for mode in ("on", "off") if n % 2 == 0 else ("off", "on"):
                rdzv, restart = trial(root / mode / "c.sock", uid, root / mode, n)
                times[mode]["rendezvous"].append(rdzv)
                times[mode]["restart"].append(restart)
        med = {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()}
        return {
            f"{k}_median_s": {m: round(med[m][k], 4) for m in med}
            | {"ratio_on_off": round(med["on"][k] / med["off"][k], 3)}
            for k in ("rendezvous", "restart")
        } | {"trials": trials}
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)
        subprocess.run(["userdel", user], timeout=20)
        shutil.rmtree(root, ignore_errors=True)


async def admit_ms(nft: Nft | None, rounds: int = 40) -> float:
    pf = PortFilter(nft, Mode.ON) if nft is not None else PortFilter.disabled("bench")
    await pf.start()
    spent = []
    for n in range(rounds):  # the members change each round: a transaction every time
        addrs = frozenset(ipaddress.ip_address(0x0A000000 + i + n % 7) for i in range(64))
        t0 = time.perf_counter()
        await pf.admit(Guard("bench", 4242, addrs, frozenset({(ipaddress.ip_address("127.0.0.1"), 29500)})))
        spent.append(time.perf_counter() - t0)
    await pf.close()
    return round(statistics.median(spent) * 1e3, 3)


def rules_per_job() -> dict[str, int]:
    return {
        f"{jobs} jobs, {members} members": rule_count(
            commands(desired({f"j{j}": Guard(f"j{j}", 1000 + j, frozenset(
                ipaddress.ip_address(0x0A000000 + i) for i in range(members))) for j in range(jobs)}))
        ) // jobs
        for jobs, members in ((1, 2), (1, 1024), (8, 64))
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    admit = {
        "libnftables": asyncio.run(admit_ms(NftLib.find())),
        "nft_cli": asyncio.run(admit_ms(NftCli.find())),
        "off": asyncio.run(admit_ms(None)),
    }
    report = {"admit_median_ms": admit, "rules_per_job": rules_per_job()} | daemons(args.trials)
    report["load"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
