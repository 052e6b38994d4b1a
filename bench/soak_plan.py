"""The chaos soak's fault plan: which fault, when, against which node or rank. Pure and seeded.

A run is reproducible: the same seed, duration, kinds and cluster size give the same plan. The
plan's times are the earliest moments a fault may start (offsets from the job's first step at full
strength); the runner injects faults one at a time and never before the previous one recovered,
so a slow recovery pushes the rest of the plan back, and whatever no longer fits is not injected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    WORKER_KILL = "worker_kill"  # kill -9 of one node's worker
    DAEMON_KILL = "daemon_kill"  # kill -9 of a daemon, then a restart (same node id, same state dir)
    DAEMON_STOP = "daemon_stop"  # SIGSTOP of a daemon for longer than the lease TTL, then SIGCONT
    ETCD_RESTART = "etcd_restart"  # kill -9 of etcd, then a restart on the same data dir
    DRAIN = "drain"  # drain a node, wait for the job to go on without it, undrain it
    HUNG_RANK = "hung_rank"  # one rank stops making progress (needs submit --hang-timeout)
    # Partitions (need the cluster in network namespaces: soak_cluster, tests/netfaults.py):
    ETCD_CUT = "etcd_cut"  # one node cut from etcd (both ways), not from its peers
    PEER_CUT = "peer_cut"  # one node cut from its peers (both ways), not from etcd
    ONE_WAY = "one_way_loss"  # everything one node sends is dropped; what it receives arrives
    ETCD_SLOW = "etcd_slow"  # every request to etcd delayed 200 ms, and a worker killed meanwhile


ALL_KINDS = tuple(FaultKind)
PARTITION_KINDS = (FaultKind.ETCD_CUT, FaultKind.PEER_CUT, FaultKind.ONE_WAY, FaultKind.ETCD_SLOW)


@dataclass(frozen=True)
class Fault:
    index: int
    at_s: float  # earliest start, seconds after the job first ran at full strength
    kind: FaultKind
    target: int  # node index (daemon faults, worker kill, drain) or global rank (hung rank)


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """``all`` or a comma-separated list of kinds; order and repeats do not matter."""
    if text.strip() == "all":
        return ALL_KINDS
    kinds = []
    for word in text.split(","):
        word = word.strip()
        if word:
            try:
                kinds.append(FaultKind(word))
            except ValueError:
                raise ValueError(f"unknown fault kind {word!r} (known: {', '.join(ALL_KINDS)})") from None
    if not kinds:
        raise ValueError("no fault kinds given")
    return tuple(dict.fromkeys(kinds))


def make_plan(
    seed: int,
    window_s: float,
    kinds: tuple[FaultKind, ...],
    *,
    nodes: int,
    gap_s: float,
) -> tuple[Fault, ...]:
    """Faults spaced ``gap_s`` apart (plus up to a third of it of jitter) over ``window_s``.

    Every kind comes once, in a seeded order, before any repeats: a short run still covers them
    all (when they fit). A fault's target is a node index below ``nodes``, or for a hung rank a
    global rank below ``nodes`` (one worker per node).
    """
    if not kinds:
        return ()
    rng = random.Random(seed)
    slots = max(len(kinds), int(window_s // gap_s))
    first = list(kinds)
    rng.shuffle(first)
    order = first + [rng.choice(kinds) for _ in range(slots - len(kinds))]
    plan = []
    for i, kind in enumerate(order):
        at = i * gap_s + rng.uniform(0, gap_s / 3)
        plan.append(Fault(i, round(at, 2), kind, rng.randrange(nodes)))
    return tuple(plan)
