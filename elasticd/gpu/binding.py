"""Which CPUs each local rank is bound to, for torchrun's ``--numa-binding``. Pure.

A rank's home is the NUMA node of its GPU (the node holding most of the CPUs NVML, or sysfs'
``local_cpulist``, names as the GPU's), or, on a host without GPUs, node ``local_rank mod
nodes``, so that ranks spread over the nodes. Then, as torchrun's values say:

- ``node``: every CPU of the home node;
- ``socket``: every CPU of the socket (package) the home node is on;
- ``exclusive``: the home node's physical cores (each with its hardware threads) split into equal,
  disjoint runs among the ranks at home there, so that no two ranks share a core;
- ``core-complex``: one L3 cache domain of the home node, a different one for each rank at home
  there (in turn once there are more ranks than domains).

Every set is cut to the CPUs the daemon may use; a rank whose set comes out empty is not bound
(None). With ``--cpu-limit`` and no cgroups, the pinned cores are taken within the set
(``limited``). A bound rank's memory prefers the NUMA nodes its CPUs are on (``memory_nodes``:
set by the worker itself, ``workers/zygote_program/mempolicy.py``), unless the layout was a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MODES = ("node", "socket", "exclusive", "core-complex")


@dataclass(frozen=True)
class Host:
    nodes: dict[int, frozenset[int]]  # NUMA node -> its CPUs
    sockets: tuple[frozenset[int], ...] = ()  # each package's CPUs
    complexes: tuple[frozenset[int], ...] = ()  # CPUs sharing one L3 cache
    cores: tuple[frozenset[int], ...] = ()  # each physical core's hardware threads (SMT siblings)
    measured: bool = True  # False: sysfs said nothing, ``nodes`` is a guess (node 0 holds every CPU)


def home(host: Host, gpu_cpus: frozenset[int], local_rank: int) -> int:
    """The rank's NUMA node: the one holding most of its GPU's CPUs, else by turns."""
    ids = sorted(host.nodes)
    if gpu_cpus:
        best = max(ids, key=lambda n: (len(host.nodes[n] & gpu_cpus), -n))
        if host.nodes[best] & gpu_cpus:
            return best
    return ids[local_rank % len(ids)]


def bind(
    mode: str, host: Host, gpu_cpus: Sequence[frozenset[int]], allowed: frozenset[int]
) -> list[frozenset[int] | None]:
    """Each local rank's CPUs (``gpu_cpus[r]``: its GPU's CPUs, empty on a CPU host)."""
    if mode not in MODES or not host.nodes:
        raise ValueError(f"unknown NUMA binding {mode!r}")
    homes = [home(host, cpus, r) for r, cpus in enumerate(gpu_cpus)]
    out: list[frozenset[int] | None] = []
    for rank, node in enumerate(homes):
        peers = [r for r, h in enumerate(homes) if h == node]
        cpus = _cpus(mode, host, node, peers.index(rank), len(peers)) & allowed
        out.append(cpus or None)
    return out


def _cpus(mode: str, host: Host, node: int, turn: int, sharing: int) -> frozenset[int]:
    mine = host.nodes[node]
    if mode == "socket":
        socket = next((s for s in host.sockets if s & mine), frozenset())
        return socket | mine
    if mode == "exclusive":
        ordered = physical_cores(host, mine)
        size = max(1, len(ordered) // sharing)
        run = ordered[turn * size : (turn + 1) * size] if turn < len(ordered) else ordered
        return frozenset().union(*run)
    if mode == "core-complex":
        domains = [c & mine for c in host.complexes if c & mine] or [mine]
        return domains[turn % len(domains)]
    return mine


def physical_cores(host: Host, cpus: frozenset[int]) -> list[frozenset[int]]:
    """``cpus`` grouped by physical core, in CPU order (a CPU of no known core is a core alone)."""
    cores = {c & cpus for c in host.cores if c & cpus}
    known = frozenset().union(*cores) if cores else frozenset()
    cores |= {frozenset({cpu}) for cpu in cpus - known}
    return sorted(cores, key=min)


def memory_nodes(host: Host, cpus: frozenset[int] | None) -> frozenset[int] | None:
    """The nodes whose memory a rank bound to ``cpus`` prefers: those holding its CPUs. None: no
    policy (not bound, or a guessed layout, whose node 0 may not be the CPUs' node)."""
    if cpus is None or not host.measured:
        return None
    return frozenset(n for n, mine in host.nodes.items() if mine & cpus) or None


def limited(cpus: frozenset[int], cpu_limit: float, local_rank: int) -> frozenset[int]:
    """``ceil(cpu_limit)`` cores of ``cpus`` for a rank pinned without cgroups, rotated by rank."""
    ordered = sorted(cpus)
    count = max(1, min(len(ordered), math.ceil(cpu_limit - 1e-9)))
    start = (local_rank * count) % len(ordered)
    return frozenset(ordered[(start + i) % len(ordered)] for i in range(count))
