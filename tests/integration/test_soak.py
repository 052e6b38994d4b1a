"""The chaos soak (bench/soak.py), short: every fault kind once, partitions included where network
namespaces can be used (CI runs as root), then its end checks hold, on a mixed cluster (the daemons
alternate etcd clients, as tests/etcd_clients.py has them: node 1 on grpc, nodes 0 and 2 on the
gateway). The seed is one whose plan kills, freezes and cuts from etcd the daemon on grpc, so that
client's reconnects, lease keep-alives and watches go through each (``test_the_plan_hits_the_grpc_daemon``).

The soak starts its own etcd and daemons (through tests/support.py) and cleans them up itself;
``tests/soak_run.py`` bounds it, and on a timeout stops it and removes what it left.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from tests.support import REPO, DaemonProc, etcd_available

sys.path.append(str(REPO / "bench"))  # bench/ is scripts, not a package

from soak_check import allowed_key, check_crash_loss, check_etcd_client, check_rounds_disjoint
from soak_cluster import Cluster, LifeLine, Step
from soak_plan import ALL_KINDS, PARTITION_KINDS, FaultKind, make_plan, parse_kinds

from elasticd.etcd.keys import Keys
from tests.etcd_clients import policy
from tests.netns import unavailable_reason as netns_unavailable
from tests.soak_run import SoakRun, run_soak

pytestmark = pytest.mark.slow

SEED = 19
GAP_S = 8
DURATION_S = 80  # ten slots of GAP_S: each kind once, no repeats
BOUND_S = 300  # the soak's own budget: the faults and their recoveries, set-up, the finish, the checks
TTL_S = 3  # the soak's default --ttl
GRPC_NODE = 1  # the second daemon of a mixed cluster
ON_THE_GRPC_DAEMON = (FaultKind.DAEMON_KILL, FaultKind.DAEMON_STOP, FaultKind.ETCD_CUT)
FENCING = (FaultKind.ETCD_CUT, FaultKind.ONE_WAY)  # the node loses etcd: its lease goes, its workers must die


def test_plan_is_seeded_and_covers_every_kind_first() -> None:
    plan = make_plan(SEED, 90, ALL_KINDS, nodes=3, gap_s=8)
    assert plan == make_plan(SEED, 90, ALL_KINDS, nodes=3, gap_s=8)
    assert plan != make_plan(SEED + 1, 90, ALL_KINDS, nodes=3, gap_s=8)
    assert {f.kind for f in plan[: len(ALL_KINDS)]} == set(ALL_KINDS)
    assert all(0 <= f.target < 3 for f in plan)
    assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)
    assert all(b.at_s - a.at_s >= 8 - 8 / 3 for a, b in itertools.pairwise(plan))
    assert parse_kinds("drain, worker_kill,drain") == (FaultKind.DRAIN, FaultKind.WORKER_KILL)
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_kinds("meteor")


def test_crash_loss_bound_and_allowed_keys() -> None:
    def log(*steps: int) -> list[Step]:
        return [Step(s, 3, 0, float(i)) for i, s in enumerate(steps)]

    assert check_crash_loss(log(0, 1, 2, 3, 4), every=2).ok
    assert check_crash_loss(log(0, 1, 2, 3, 2, 3, 4), every=2).ok  # 2 redone: within the bound
    assert not check_crash_loss(log(0, 1, 2, 3, 1, 2), every=2).ok  # 3 redone
    assert not check_crash_loss(log(0, 1, 3), every=2).ok  # a step never run
    k, job, live = Keys("/p"), "job-1", {"n1"}
    ok = [k.job_spec(job), k.job_body(job), k.job_final(job), k.result(job, 7), k.done(job, 7, "n2"),
          k.left(job, 6, "n2"), k.lead(job, 7, "n2"), k.node("n1"), k.janitor(),
          k.node_status(job, "n1")]  # fmt: skip
    leaked = [k.result(job, 5), k.waiting(job, "n1"), k.drain("n2"), k.node("n2"), k.job_drain(job, "n1"),
              k.pending_note(job, "n1"), k.job_spec("other"), k.job_body("other"), "/p/junk",
              k.node_status(job, "n2"), k.node_status("other", "n1"), k.join(job, 5, "n1"),
              k.lead(job, 5, "n1"),
              f"/p/jobs/{job}/nodes/n1", f"/p/jobs/{job}/pending/n1"]  # fmt: skip
    assert all(allowed_key(k, key, job, 7, live) for key in ok)
    assert not any(allowed_key(k, key, job, 7, live) for key in leaked)


def test_rounds_disjoint_from_the_workers_own_lines() -> None:
    def life(pid: int, rnd: int, at: float) -> LifeLine:
        return LifeLine(pid, "alive", rnd, 0, "n", at)

    apart = [
        life(1, 0, 0.0),
        life(2, 0, 0.5),
        life(1, 0, 1.0),
        life(3, 1, 1.2),
        life(3, 1, 2.0),
        life(4, 3, 2.5),
    ]
    assert check_rounds_disjoint(apart).ok
    # A worker of round 0 still alive (a beat) after round 1's first worker started: two live rounds.
    late = [*apart, life(2, 0, 1.3)]
    check = check_rounds_disjoint(late)
    assert not check.ok and "round 1 started" in check.detail
    # Rounds are compared to every earlier one, not only the previous.
    assert not check_rounds_disjoint([*apart, life(9, 0, 2.6)]).ok
    assert not check_rounds_disjoint([]).ok  # no life line at all: the job never ran


def test_the_plan_hits_the_grpc_daemon() -> None:
    """The mixed soak's plan puts a daemon kill, a daemon freeze and a cut from etcd on the daemon
    on grpc (a new seed must keep that, or the soak would leave that client's recoveries out)."""
    plan = make_plan(SEED, DURATION_S, ALL_KINDS, nodes=3, gap_s=GAP_S)
    assert sorted(f.kind for f in plan) == sorted(ALL_KINDS)
    assert all(f.target == GRPC_NODE for f in plan if f.kind in ON_THE_GRPC_DAEMON), plan


@pytest.mark.torch
@pytest.mark.timeout(BOUND_S + 90)
@pytest.mark.skipif(not etcd_available(), reason="no etcd binary")
def test_soak_survives_every_fault_kind(tmp_path: Path) -> None:
    """Every kind once; where namespaces can be used, the partitions' own checks too: a node that
    loses etcd has its workers dead within TTL + 1 s and the job goes on without it before the
    heal; a slowed etcd costs no lease (the worker kill under it makes the only new round)."""
    pytest.importorskip("torch")
    clients = policy().mode
    run = run_soak(
        ["--duration", str(DURATION_S), "--seed", str(SEED), "--faults", "all", "--gap", str(GAP_S),
         "--ttl", str(TTL_S), "--recover-timeout", "60", "--etcd-client", clients],
        tmp_path, BOUND_S,
    )  # fmt: skip
    assert_passed(run)
    assert run.result["etcd_client"] == clients, run.text[-6000:]
    if netns_unavailable() is not None:
        return
    assert set(run.result["kinds"]) == set(ALL_KINDS), run.result["table"]
    faults = {f["fault"]["kind"]: f for f in run.result["faults"]}
    for kind in PARTITION_KINDS:  # the fault broke the round it hit: a newer round ran steps after it
        assert faults[kind]["resumed_s"] is not None, faults[kind]
    for kind in FENCING:
        f = faults[kind]
        assert f["fenced_s"] is not None and f["fenced_s"] <= TTL_S + 1.0, f
        assert f["resumed_s"] is not None, f  # went on without the node before it was healed
    slow = faults[FaultKind.ETCD_SLOW]["rounds"]
    assert slow == [slow[0], slow[0] + 1], faults[FaultKind.ETCD_SLOW]


def assert_passed(run: SoakRun) -> None:
    """The soak exited 0 and left nothing; the job SUCCEEDED; every end check held (ledger exact,
    no orphan, no leaked key, the daemons on the asked client); every kind injected and survived."""
    text, result = run.text, run.result
    assert run.returncode == 0, text[-6000:]
    assert not run.leftovers, run.leftovers
    assert result["ok"] and result["state"] == "SUCCEEDED", text[-6000:]
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed, failed
    injected = {row["kind"] for row in result["table"] if row["injected"] > 0}
    assert injected == set(result["kinds"]), result["table"]
    assert all(row["survived"] == row["injected"] for row in result["table"]), result["table"]


def started(d: DaemonProc, *clients: str) -> None:
    """Write the daemon's log as if it had started once on each of ``clients``."""
    d.root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"event": "etcd.connected", "client": cl}) for cl in clients]
    d.stderr_path.write_text("\n".join(["not json", *lines]) + "\n")


def test_etcd_client_check_reads_every_daemon_start(tmp_path: Path) -> None:
    """The check behind "every daemon on the grpc client": every start's ``etcd.connected`` counts."""
    c = Cluster(tmp_path, 2, ttl_s=3, daemon_stop_grace_s=5, etcd_client="grpc")
    a, b = c.daemons
    assert all(d.args[d.args.index("--etcd-client") + 1] == "grpc" for d in c.daemons)
    started(a, "grpc", "grpc")  # started, killed, restarted
    started(b)
    check = check_etcd_client(c)
    assert not check.ok and b.node_id in check.detail
    started(b, "grpc", "gateway")
    assert not check_etcd_client(c).ok
    started(b, "grpc")
    check = check_etcd_client(c)
    assert check.ok and "3 daemon starts on grpc" in check.detail, check


def test_a_mixed_soak_alternates_clients_and_checks_each_daemons_own(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 3, ttl_s=3, daemon_stop_grace_s=5, etcd_client="mixed")
    assert [d.etcd_client for d in c.daemons] == ["gateway", "grpc", "gateway"]
    a, b, d = c.daemons
    started(a, "gateway")
    started(b, "grpc", "grpc")
    started(d, "gateway")
    check = check_etcd_client(c)
    assert check.ok and "4 daemon starts on mixed" in check.detail, check
    started(d, "grpc")  # the third on grpc: not what mixed gives it
    check = check_etcd_client(c)
    assert not check.ok and d.node_id in check.detail, check
