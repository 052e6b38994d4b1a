"""The rendezvous model's arithmetic (bench/rdzv_model.py): each step from the measured rates."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from elasticd.agent.executor import LEADER_BATCH_S
from tests.support import REPO

sys.path.append(str(REPO / "bench"))  # bench/ is scripts, not a package

from rdzv_model import GOAL_S, RTT_S, Rates, measured, predict, transactions

RATES = Rates(joins_read_s_per_join=1e-5, txn_s=0.01, read_etcd_cpu_s=1e-3, event_etcd_cpu_s=1e-4, cores=2.0)


def bench(**rates: Any) -> dict[str, Any]:
    base = {"joins_read_s_per_join": 2e-5, "txn_s": 0.02, "read_etcd_cpu_s": 4e-3, "event_etcd_cpu_s": 5e-4}
    return {
        "cpus": 2,
        "etcd_rates": base | rates,
        "outcomes": [
            {"side": "elasticd", "n": 256, "result_event": [0.01, 0.05], "after_last_join": 0.8},
            {"side": "elasticd", "n": 1024, "result_event": [0.05, 0.2], "after_last_join": 2.5},
            {"side": "elasticd", "n": 4096, "result_event": None, "after_last_join": None},  # did not finish
        ],
    }


@pytest.mark.parametrize(("n", "txns"), [(1, 2), (120, 2), (121, 3), (12_500, 106), (100_000, 835)])
def test_the_leader_writes_the_assignments_in_batches_then_the_head(n: int, txns: int) -> None:
    assert transactions(n) == txns


def test_each_step_is_its_measured_cost_times_its_count() -> None:
    p = predict(RATES, 1000, 1)
    assert p.leader_read_s == pytest.approx(LEADER_BATCH_S + 1000 * 1e-5)
    assert p.close_s == pytest.approx(transactions(1000) * 0.01)  # one member: no quorum round trip
    assert p.fanout_s == pytest.approx(1000 * 1e-4 / 2.0)
    assert p.reads_s == pytest.approx(2 * 1000 * 1e-3 / 2.0)
    assert p.total_s == pytest.approx(p.leader_read_s + p.close_s + p.fanout_s + p.reads_s)


def test_members_spread_reads_and_watches_and_add_a_round_trip_to_each_write() -> None:
    one, three, five = (predict(RATES, 12_500, m) for m in (1, 3, 5))
    assert three.reads_s == pytest.approx(one.reads_s / 3) and five.fanout_s == pytest.approx(
        one.fanout_s / 5
    )
    assert three.leader_read_s == one.leader_read_s  # the joins are read by one node
    assert three.close_s == pytest.approx(transactions(12_500) * (0.01 + RTT_S)) == five.close_s


def test_the_rates_come_from_the_bench() -> None:
    rates = Rates.of(bench())
    assert rates.event_etcd_cpu_s == 5e-4
    assert (rates.txn_s, rates.read_etcd_cpu_s, rates.cores) == (0.02, 4e-3, 2.0)
    assert Rates.of(bench(), cores=8).cores == 8
    assert measured(bench()) == [(256, 0.8), (1024, 2.5)]


def test_a_bench_without_its_rates_cannot_feed_the_model() -> None:
    data = bench()
    data["etcd_rates"] = {}
    with pytest.raises(ValueError, match="no etcd rates"):
        Rates.of(data)
    with pytest.raises(ValueError):
        predict(RATES, 0, 3)


def test_the_goal_is_ten_seconds() -> None:
    assert GOAL_S == 10.0
