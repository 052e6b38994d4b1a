"""elasticd.gpu.placement.choose: the best common link, property-tested on fake topologies."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.gpu import fake, read
from elasticd.gpu.placement import choose, common_link
from elasticd.gpu.topology import Link, Topology


def topology(nvml: Any) -> Topology:
    return read.read_gpus(nvml)[1]


def hybrid_cube_mesh() -> Topology:
    """DGX-1: two fully linked quads, each GPU also linked to its twin in the other quad."""
    nvml = fake.two_sockets(8)
    nvml.nvlinked = {frozenset(p) for p in itertools.combinations(range(4), 2)}
    nvml.nvlinked |= {frozenset(p) for p in itertools.combinations(range(4, 8), 2)}
    nvml.nvlinked |= {frozenset((i, i + 4)) for i in range(4)}
    return topology(nvml)


TOPOLOGIES = {
    "dgx_like": topology(fake.dgx_like(8)),
    "pcie_only": topology(fake.pcie_only(8)),
    "two_sockets": topology(fake.two_sockets(8)),
    "hybrid_cube_mesh": hybrid_cube_mesh(),
    "unknown": Topology(),
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, list[int], int]:
    name = draw(st.sampled_from(sorted(TOPOLOGIES)))
    free = draw(st.lists(st.integers(0, 7), unique=True, max_size=8))
    count = draw(st.integers(1, 8))
    return name, free, count


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_choice_is_valid_and_its_common_link_is_the_best_there_is(
    case: tuple[str, list[int], int],
) -> None:
    name, free, count = case
    link = TOPOLOGIES[name].link
    got = choose(free, count, link)
    if count > len(free):
        assert got is None
        return
    assert got is not None
    assert len(got) == count and len(set(got)) == count and set(got) <= set(free)
    assert list(got) == sorted(got)
    best = min(common_link(c, link) for c in itertools.combinations(sorted(free), count))
    assert common_link(got, link) == best
    assert choose(list(reversed(free)), count, link) == got  # the order of free slots is no input


@pytest.mark.parametrize(
    ("name", "free", "count", "expected"),
    [
        ("two_sockets", [1, 2, 3, 4, 5, 6, 7], 2, (2, 3)),  # a whole PCIe switch, not GPU 1's orphan
        ("two_sockets", [1, 2, 3, 4, 5, 6, 7], 1, (1,)),  # best fit: the orphan, pairs stay whole
        ("two_sockets", [0, 1, 2, 4, 5, 6, 7], 4, (4, 5, 6, 7)),  # one socket rather than two
        ("two_sockets", [0, 2, 4, 5, 6], 2, (4, 5)),
        ("pcie_only", [0, 2, 3, 5], 2, (2, 3)),
        ("dgx_like", [0, 3, 5, 6], 3, (0, 3, 5)),  # all NVLink: lowest first
        ("hybrid_cube_mesh", [0, 1, 4, 5, 6], 3, (4, 5, 6)),  # a linked triple, not 0-1 + a twin
        ("unknown", [0, 1, 3, 4, 5], 3, (0, 1, 3)),  # no topology: lowest first
    ],
)
def test_choices(name: str, free: list[int], count: int, expected: tuple[int, ...]) -> None:
    assert choose(free, count, TOPOLOGIES[name].link) == expected


def test_levels() -> None:
    t = TOPOLOGIES["two_sockets"]
    assert common_link((0, 1), t.link) is Link.PCIE_SWITCH
    assert common_link((0, 2), t.link) is Link.SOCKET
    assert common_link((0, 4), t.link) is Link.SYSTEM
    assert choose([0, 1], 0, t.link) is None
