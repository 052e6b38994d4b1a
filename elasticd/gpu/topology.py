"""How a node's GPUs are linked to each other: one level per pair, best first. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Link(IntEnum):
    """The best path between two GPUs, as placement ranks them (lower is better).

    NVLINK: NVLink, directly or through an NVSwitch fabric; PCIE_SWITCH: under one PCIe switch
    (or several chained ones); HOSTBRIDGE: through one CPU's host bridge; SOCKET: within one
    socket (NUMA node) across host bridges; SYSTEM: across sockets.
    """

    NVLINK = 0
    PCIE_SWITCH = 1
    HOSTBRIDGE = 2
    SOCKET = 3
    SYSTEM = 4


@dataclass(frozen=True)
class Topology:
    """``links[i][j]``: the link between the GPUs at positions ``i`` and ``j`` of the inventory.
    An empty topology (unknown) ranks every pair SYSTEM."""

    links: tuple[tuple[Link, ...], ...] = ()

    def link(self, a: int, b: int) -> Link:
        if a == b:
            return Link.NVLINK
        if a < len(self.links) and b < len(self.links[a]):
            return self.links[a][b]
        return Link.SYSTEM

    def worst(self, gpus: tuple[int, ...]) -> Link:
        """The common link of a set: the worst of its pairs (NVLINK for one GPU)."""
        return max((self.link(a, b) for a in gpus for b in gpus if a < b), default=Link.NVLINK)

    @classmethod
    def uniform(cls, n: int, link: Link) -> Topology:
        return cls(tuple(tuple(Link.NVLINK if i == j else link for j in range(n)) for i in range(n)))
