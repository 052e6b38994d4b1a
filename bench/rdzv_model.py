"""A model of one rendezvous round beyond what one machine can play: the time from the last join
to every node holding its assignment, at N nodes, against an etcd of M members.

Its inputs are what ``bench_rdzv_scale.py --json`` measured on this machine (``etcd_rates``);
nothing is taken from elsewhere but the two stated assumptions below. The round after the last
join is four steps, each a sum of measured costs:

1. the leader reads every join once more (it is woken by the last one): N x the measured seconds
   per join read and parsed, after the executor's batch wait (``LEADER_BATCH_S``);
2. it writes the round: ceil(N / 120) transactions of assignments, then the head, one after the
   other (each waits for the previous): the measured seconds per transaction, plus one network
   round trip to a quorum when etcd has more than one member (``RTT_S``, an assumption: a LAN);
3. etcd sends the head to the N watchers: N events at the measured etcd CPU per event delivered,
   over the etcd members' cores;
4. each member makes its two small reads (the glance, then the head and its own assignment):
   2N requests at the measured etcd CPU per request, over the etcd members' cores.

Steps 3 and 4 are etcd's capacity, not the time one request takes: on this machine the measured
rounds wait for the participants' own threads (N of them on 2 shared cores), which on a cluster
each have a host of their own. That is why the model is checked against the measured points and
the ratio shown, rather than fitted to them.

What M changes: every write goes through etcd's leader and is replicated (steps 1-2 do not
spread; a quorum round trip is added to each transaction, which is why they are few and large);
reads and watches are served by whichever member a client talks to (a linearizable read asks the
leader for its index only), so steps 3-4 spread over the M members. ``CORES`` per member is the
second assumption: this machine's cores (measured on 2, shared), unless ``--cores`` says other.
The model is checked against the measured points first (``--json`` of the bench): at M = 1, on
this machine, it predicts each measured N, and the ratio says how far to trust it.

    .venv/bin/python bench/rdzv_model.py --json bench.json [--sizes 12500,100000] [--members 3,5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticd.agent.executor import LEADER_BATCH_S
from elasticd.rendezvous.roster import MAX_TXN_PUTS

RTT_S = 0.0005  # a round trip between etcd members on one LAN (assumed; 0 with one member)
GOAL_S = 10.0  # every node holds its assignment within this of the last join, at 12,500 nodes
MEMBER_READS = 2  # a member's requests after the close: its glance, then the head and its assignment


@dataclass(frozen=True)
class Rates:
    """What etcd and the leader cost per operation, as measured on one machine."""

    joins_read_s_per_join: float  # the leader's read of the joins, per join (etcd and parsing)
    txn_s: float  # one transaction of ``MAX_TXN_PUTS`` assignments, sent to written
    read_etcd_cpu_s: float  # etcd's CPU per member read
    event_etcd_cpu_s: float  # etcd's CPU per watch event delivered
    cores: float  # the cores each etcd member has

    @classmethod
    def of(cls, bench: dict[str, Any], cores: float | None = None) -> Rates:
        """The rates from ``bench_rdzv_scale``'s JSON (its ``etcd_rates``)."""
        rates = bench.get("etcd_rates") or {}
        if not rates:
            raise ValueError("the bench's JSON holds no etcd rates (it ran with --no-rates)")
        return cls(
            joins_read_s_per_join=float(rates["joins_read_s_per_join"]),
            txn_s=float(rates["txn_s"]),
            read_etcd_cpu_s=float(rates["read_etcd_cpu_s"]),
            event_etcd_cpu_s=float(rates["event_etcd_cpu_s"]),
            cores=float(cores if cores is not None else bench.get("cpus") or os.cpu_count() or 1),
        )


@dataclass(frozen=True)
class Prediction:
    """The round's time after the last join at ``n`` nodes and ``members`` etcd members, by step."""

    n: int
    members: int
    leader_read_s: float
    close_s: float
    fanout_s: float
    reads_s: float

    @property
    def total_s(self) -> float:
        """The steps one after the other: the fan-out and the reads overlap in fact, so this errs long."""
        return self.leader_read_s + self.close_s + self.fanout_s + self.reads_s

    @property
    def transactions(self) -> int:
        return transactions(self.n)


def transactions(n: int) -> int:
    """The leader's transactions for a round of ``n``: the assignments in batches, then the head."""
    return math.ceil(n / MAX_TXN_PUTS) + 1


def predict(rates: Rates, n: int, members: int) -> Prediction:
    if n < 1 or members < 1:
        raise ValueError("a round has at least one node, etcd at least one member")
    rtt = RTT_S if members > 1 else 0.0
    return Prediction(
        n=n,
        members=members,
        leader_read_s=LEADER_BATCH_S + n * rates.joins_read_s_per_join,
        close_s=transactions(n) * (rates.txn_s + rtt),
        fanout_s=n * rates.event_etcd_cpu_s / (members * rates.cores),
        reads_s=MEMBER_READS * n * rates.read_etcd_cpu_s / (members * rates.cores),
    )


def measured(bench: dict[str, Any]) -> list[tuple[int, float]]:
    """(N, seconds from the last join to every participant holding its assignment) per finished run."""
    return [
        (o["n"], float(o["after_last_join"]))
        for o in bench["outcomes"]
        if o["side"] == "elasticd" and o.get("after_last_join") is not None
    ]


def _row(p: Prediction, seen: float | None = None) -> str:
    seen_text = f"{seen:>9.2f}" if seen is not None else f"{'':>9}"
    ratio = f"{seen / p.total_s:>6.2f}" if seen is not None and p.total_s > 0 else f"{'':>6}"
    return (
        f"{p.n:>7} {p.members:>3} {p.transactions:>5} {p.leader_read_s:>8.2f} {p.close_s:>8.2f}"
        f" {p.fanout_s:>8.2f} {p.reads_s:>8.2f} {p.total_s:>9.2f} {seen_text} {ratio}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--json", type=Path, required=True, help="bench_rdzv_scale.py's --json output")
    p.add_argument("--sizes", default="12500,100000")
    p.add_argument("--members", default="3,5")
    p.add_argument(
        "--cores", type=float, default=None, help="cores per etcd member (default: the bench's machine)"
    )
    args = p.parse_args(argv)
    bench = json.loads(args.json.read_text())
    rates = Rates.of(bench, args.cores)
    print(f"inputs: {rates}")
    head = f"{'N':>7} {'M':>3} {'txns':>5} {'lead rd':>8} {'close':>8} {'fan-out':>8} {'reads':>8}"
    print(head + f" {'model s':>9} {'measured':>9} {'ratio':>6}")
    for n, seen in measured(bench):
        print(_row(predict(rates, n, 1), seen))
    for n in (int(s) for s in args.sizes.split(",")):
        for m in (int(s) for s in args.members.split(",")):
            pred = predict(rates, n, m)
            goal = (
                f"  goal {GOAL_S:g} s: {'met' if pred.total_s < GOAL_S else 'NOT met'}" if n == 12_500 else ""
            )
            print(_row(pred) + goal)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
