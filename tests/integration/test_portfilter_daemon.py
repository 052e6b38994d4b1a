"""The port filter through a real daemon: a real job of a non-root user, its two ranks listening,
and another local user knocking on the job's store port and on a rank's own listener.

The ranks are stdlib Python (the host's python3, which other users can run, has no torch): rank 0
hosts the store on ``MASTER_PORT`` on every address, as torch's ``TCPStore`` does when no store
host serves the job, and each rank opens a listener on a port the kernel picks, as gloo's pairs
do; the ranks connect to each other's listeners and to the store before they say they are ready.
The filter cannot tell them from torch's: it keys on the uid and learns listeners from their
answers. One test runs real gloo ranks, with a python the job's user can import torch with
(``tests.users.torch_for``)."""

from __future__ import annotations

import json
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elasticd.portfilter.nft import NftCli
from tests.conftest import DaemonFactory
from tests.integration.test_portfilter import connect, table_exists, users  # noqa: F401
from tests.support import wait_for
from tests.users import (
    OTHER_USERS,
    SYSTEM_PYTHON,
    as_user,
    public_daemon,
    public_dir,
    public_workdir,
    torch_for,
)

pytestmark = [
    *OTHER_USERS,
    pytest.mark.skipif(NftCli.find() is None, reason="no nft binary: apt-get install nftables"),
    pytest.mark.xdist_group("nft"),
    pytest.mark.timeout(180),
]
RANK = """
import json, os, socket, sys, time
here = os.path.dirname(os.path.abspath(__file__))
rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
if rank == 0 and os.environ["TORCHELASTIC_USE_AGENT_STORE"] != "True":
    store = socket.create_server(("0.0.0.0", port), backlog=64)  # as torch's TCPStore binds
mine = socket.create_server(("0.0.0.0", 0), backlog=64)  # a gloo-like listener of this rank
with open(os.path.join(here, f"port.{rank}.tmp"), "w") as f:
    f.write(str(mine.getsockname()[1]))
os.rename(os.path.join(here, f"port.{rank}.tmp"), os.path.join(here, f"port.{rank}"))
peer = os.path.join(here, f"port.{1 - rank}")
deadline = time.monotonic() + 60
while not os.path.exists(peer) and time.monotonic() < deadline:
    time.sleep(0.05)
for target in (int(open(peer).read()), port):  # the job's own connects: the peer's, the store
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", target), timeout=5).close()
            break
        except ConnectionRefusedError:  # the store not listening yet
            time.sleep(0.1)
    else:
        sys.exit(f"cannot reach {target}")
ready = {"pid": os.getpid(), "listener": mine.getsockname()[1], "master_port": port}
with open(os.path.join(here, f"ready.{rank}"), "w") as f:
    json.dump(ready, f)
while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0 if os.path.exists(os.path.join(here, "go")) else 5)
"""


@pytest.fixture
def public() -> Iterator[Path]:
    with public_dir() as path:
        yield path


def listening(pid: int) -> set[int]:
    """The TCP ports ``pid`` listens on, as the kernel says (what an attacker's ``ss -ltnp`` shows)."""
    conns = psutil.net_connections(kind="tcp")
    mine = [c for c in conns if c.pid == pid and c.status == psutil.CONN_LISTEN]
    return {int(getattr(c.laddr, "port", 0)) for c in mine}  # laddr is () for a socket unbound


def rules_of(uid: int) -> bool:
    listed = subprocess.run(["nft", "list", "table", "inet", "elasticd"], capture_output=True, text=True)
    return listed.returncode == 0 and f"out_{uid}" in listed.stdout


def test_a_real_jobs_ports_refuse_another_local_user_and_admit_its_own(
    users: tuple[int, int],  # noqa: F811  (first: removed after the daemon)
    daemon_factory: DaemonFactory,
    public: Path,
) -> None:
    owner, other = users
    d = public_daemon(daemon_factory, public, "--port-filter")
    work = public_workdir(public)
    script = work / "rank.py"
    script.write_text(RANK)
    script.chmod(0o644)
    args: dict[str, Any] = {
        "entry_kind": "script", "entry": str(script), "cwd": str(work), "python": SYSTEM_PYTHON,
        "env": {"PATH": "/usr/bin:/bin"}, "nproc_per_node": 2, "max_restarts": 0,
    }  # fmt: skip
    gid = pwd.getpwuid(owner).pw_gid
    reply = as_user(owner, gid, d.socket, "submit", **args)
    assert reply["ok"], reply
    job = str(reply["result"]["id"])
    try:
        wait_for(lambda: all((work / f"ready.{r}").exists() for r in (0, 1)), 60, what="both ranks ready")
        ready = [json.loads((work / f"ready.{r}").read_text()) for r in (0, 1)]
        store = ready[0]["master_port"]
        assert store in listening(ready[0]["pid"])
        gloo = listening(ready[1]["pid"])  # rank 1's own listener, found as an attacker would
        assert gloo == {ready[1]["listener"]}, gloo
        (rank1_port,) = gloo
        assert rules_of(owner)
        assert connect("127.0.0.1", store, other) == "refused"  # another local user, the store
        assert connect("127.0.0.1", rank1_port, other) == "refused"  # and a rank's listener
        assert connect("127.0.0.1", store, owner) == "connected"  # the job's own user
        assert connect("127.0.0.1", rank1_port, owner) == "connected"
        assert connect("127.0.0.1", rank1_port, other) == "refused"  # still, after the owner's
    finally:
        (work / "go").touch()
    status = d.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)
    assert status["state"] == "SUCCEEDED", d.log_text()[-3000:]
    wait_for(lambda: not rules_of(owner), 15, what="the job's rules to leave with it")
    d.stop()
    assert not table_exists()  # nothing of the daemon's outlives it


GLOO = """
import json, os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
here = os.path.dirname(os.path.abspath(__file__))
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
rank = dist.get_rank()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)  # the pairs connected: each rank's gloo listener is up
ready = {"pid": os.getpid(), "sum": total.item(), "master_port": int(os.environ["MASTER_PORT"])}
with open(os.path.join(here, f"gloo.{rank}.tmp"), "w") as f:
    json.dump(ready, f)
os.rename(os.path.join(here, f"gloo.{rank}.tmp"), os.path.join(here, f"gloo.{rank}"))
deadline = time.monotonic() + 90
while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if os.path.exists(os.path.join(here, "go")) else 5)
"""


@pytest.mark.torch
def test_another_user_is_refused_at_a_real_gloo_ranks_listener(
    users: tuple[int, int],  # noqa: F811  (first: removed after the daemon and its parked zygote)
    daemon_factory: DaemonFactory,
    public: Path,
) -> None:
    """A job of a non-root user doing real ``torch.distributed`` gloo with the suite's python:
    another local user's connect to a rank's gloo listener (found as ``ss -ltnp`` shows it) and
    to the store is refused, and the job, its all-reduce through the filter, succeeds."""
    owner, other = users
    python, env = torch_for(owner, public)
    d = public_daemon(daemon_factory, public, "--port-filter")
    work = public_workdir(public)
    script = work / "gloo_rank.py"
    script.write_text(GLOO)
    script.chmod(0o644)
    args: dict[str, Any] = {
        "entry_kind": "script", "entry": str(script), "cwd": str(work), "python": python,
        "env": {"PATH": "/usr/bin:/bin", "GLOO_SOCKET_IFNAME": "lo", **env},
        "nproc_per_node": 2, "max_restarts": 0,
    }  # fmt: skip
    reply = as_user(owner, pwd.getpwuid(owner).pw_gid, d.socket, "submit", **args)
    assert reply["ok"], reply
    job = str(reply["result"]["id"])
    try:
        wait_for(
            lambda: all((work / f"gloo.{r}").exists() for r in (0, 1)), 120, what="both ranks' all-reduce"
        )
        ranks = [json.loads((work / f"gloo.{r}").read_text()) for r in (0, 1)]
        assert [r["sum"] for r in ranks] == [3.0, 3.0], ranks
        store = ranks[0]["master_port"]
        gloo = listening(ranks[1]["pid"]) - {store}  # rank 1's pair listener(s)
        assert gloo, "rank 1 listens on no port"
        for port in sorted(gloo):
            assert connect("127.0.0.1", port, other) == "refused", port
        assert connect("127.0.0.1", store, other) == "refused"
    finally:
        (work / "go").touch()
    status = d.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)
    assert status["state"] == "SUCCEEDED", d.log_text()[-3000:]
