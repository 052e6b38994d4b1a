"""Which of a node's free slots a job gets: the set with the best common link. Pure.

Links rank NVLink (or one NVSwitch fabric) first, then one PCIe switch, one host bridge, one
socket, across sockets (``gpu/topology.py``), as Slurm's gres and Kubernetes' topology manager
rank them. A set's common link is the worst of its pairs. For each link level from the best, the
free slots fall into groups whose pairs are all at least that good (one PCIe switch, one socket);
the job takes the tightest group that holds it (best fit: the big groups stay whole for big jobs),
and within it, slot by slot, the one closest to those already taken (lowest first on a tie, so
with no topology known this is lowest-first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from elasticd.gpu.topology import Link

LinkOf = Callable[[int, int], Link]


def choose(free: Sequence[int], count: int, link: LinkOf) -> tuple[int, ...] | None:
    """``count`` slots of ``free`` with the best common link, or None if too few are free."""
    if count < 1 or count > len(free):
        return None
    slots = sorted(set(free))
    for level in Link:
        groups = [g for g in _cliques(slots, level, link) if len(g) >= count]
        if groups:
            best = min(groups, key=lambda g: (len(g), g))
            return tuple(sorted(_closest(best, count, link)))
    return None  # unreachable: at SYSTEM every pair qualifies


def common_link(slots: Sequence[int], link: LinkOf) -> Link:
    """The worst link between two of ``slots`` (NVLINK for one slot)."""
    return max((link(a, b) for a in slots for b in slots if a < b), default=Link.NVLINK)


def _cliques(slots: list[int], level: Link, link: LinkOf) -> list[list[int]]:
    """Groups of slots whose pairs are all at ``level`` or better, grown greedily from each slot
    in turn (with a tree-like PCIe hierarchy they are its switches, bridges and sockets; with a
    non-uniform NVLink mesh, the fully linked subsets)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for start in slots:
        group = [start]
        for s in slots:
            if s != start and all(link(s, g) <= level for g in group):
                group.append(s)
        key = tuple(sorted(group))
        if key not in seen:
            seen.add(key)
            out.append(list(key))
    return out


def _closest(group: list[int], count: int, link: LinkOf) -> list[int]:
    """``count`` slots of ``group``: from its lowest, each time the one whose links to those taken
    sum lowest (the tightest sub-group first), lowest on a tie."""
    taken = [group[0]]
    rest = group[1:]
    while len(taken) < count:
        nxt = min(rest, key=lambda s: (sum(link(s, t) for t in taken), s))
        taken.append(nxt)
        rest.remove(nxt)
    return taken
