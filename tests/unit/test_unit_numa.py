"""--numa-binding: the pure decider (gpu/binding.py), sysfs read on a fake root (node/numa.py),
and each rank's set as the launch computes it (jobs/affinity.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.gpu import fake, read
from elasticd.gpu.binding import MODES, Host, bind, home, limited, memory_nodes
from elasticd.jobs.affinity import rank_cpus
from elasticd.node.inventory import inventory_of
from elasticd.node.numa import device_cpus, parse_cpulist, read_host


def cpus(lo: int, hi: int) -> frozenset[int]:
    return frozenset(range(lo, hi + 1))


# Two sockets, one NUMA node each, two L3 domains per node.
TWO = Host(
    nodes={0: cpus(0, 7), 1: cpus(8, 15)},
    sockets=(cpus(0, 7), cpus(8, 15)),
    complexes=(cpus(0, 3), cpus(4, 7), cpus(8, 11), cpus(12, 15)),
)
# One socket of two NUMA nodes (sub-NUMA clustering).
SNC = Host(nodes={0: cpus(0, 3), 1: cpus(4, 7)}, sockets=(cpus(0, 7),), complexes=(cpus(0, 3), cpus(4, 7)))
ALL = cpus(0, 15)


def test_home_is_the_node_of_the_gpus_cpus_else_by_turns() -> None:
    assert home(TWO, cpus(8, 15), 0) == 1
    assert home(TWO, frozenset({7, 8, 9}), 0) == 1  # most of them
    assert [home(TWO, frozenset(), r) for r in range(3)] == [0, 1, 0]  # a CPU host: spread


def test_node_and_socket() -> None:
    gpus = [cpus(0, 7), cpus(8, 15)]
    assert bind("node", TWO, gpus, ALL) == [cpus(0, 7), cpus(8, 15)]
    assert bind("socket", SNC, [cpus(4, 7)], ALL) == [cpus(0, 7)]  # the whole package
    assert bind("node", SNC, [cpus(4, 7)], ALL) == [cpus(4, 7)]


def test_exclusive_splits_a_node_among_the_ranks_at_home_there() -> None:
    gpus = [cpus(0, 7), cpus(0, 7), cpus(8, 15)]
    assert bind("exclusive", TWO, gpus, ALL) == [cpus(0, 3), cpus(4, 7), cpus(8, 15)]


def test_exclusive_never_splits_a_physical_core_between_ranks() -> None:
    # SMT: CPU k and k + 4 are one core's two threads (as Linux numbers them on most x86 hosts).
    smt = Host(nodes={0: cpus(0, 7)}, cores=tuple(frozenset({c, c + 4}) for c in range(4)))
    assert bind("exclusive", smt, [cpus(0, 7)] * 2, cpus(0, 7)) == [
        frozenset({0, 1, 4, 5}),
        frozenset({2, 3, 6, 7}),
    ]


@given(st.integers(1, 8), st.integers(1, 6))
def test_exclusive_sets_are_disjoint_whole_cores(ranks: int, n_cores: int) -> None:
    smt = Host(
        nodes={0: cpus(0, 2 * n_cores - 1)}, cores=tuple(frozenset({c, c + n_cores}) for c in range(n_cores))
    )
    sets = [s for s in bind("exclusive", smt, [frozenset()] * ranks, cpus(0, 2 * n_cores - 1)) if s]
    for s in sets:
        assert all(core <= s or not core & s for core in smt.cores)  # whole cores only
    if ranks <= n_cores:
        assert all(not a & b for i, a in enumerate(sets) for b in sets[i + 1 :])


def test_core_complex_gives_each_rank_its_own_l3() -> None:
    gpus = [cpus(0, 7)] * 3
    assert bind("core-complex", TWO, gpus, ALL) == [cpus(0, 3), cpus(4, 7), cpus(0, 3)]


def test_a_cpu_host_spreads_ranks_over_nodes() -> None:
    assert bind("node", TWO, [frozenset()] * 4, ALL) == [cpus(0, 7), cpus(8, 15), cpus(0, 7), cpus(8, 15)]


def test_sets_are_cut_to_the_allowed_cpus_and_empty_means_unbound() -> None:
    assert bind("node", TWO, [cpus(0, 7), cpus(8, 15)], cpus(0, 9)) == [cpus(0, 7), frozenset({8, 9})]
    assert bind("node", TWO, [cpus(8, 15)], cpus(0, 3)) == [None]


def test_cpu_limit_pins_within_the_set() -> None:
    assert limited(cpus(8, 15), 2, 0) == {8, 9}
    assert limited(cpus(8, 15), 1.5, 1) == {10, 11}
    assert limited(frozenset({3}), 4, 0) == {3}


@given(
    st.sampled_from(MODES),
    st.sampled_from([TWO, SNC]),
    st.lists(st.sampled_from([frozenset(), cpus(0, 3), cpus(4, 7), cpus(8, 15)]), min_size=1, max_size=8),
)
def test_properties(mode: str, host: Host, gpus: list[frozenset[int]]) -> None:
    every = frozenset().union(*host.nodes.values())
    sets = bind(mode, host, gpus, every)
    assert len(sets) == len(gpus)
    for s in sets:
        assert s is not None and s <= every
    if mode == "exclusive":
        homes = [home(host, g, r) for r, g in enumerate(gpus)]
        for node in set(homes):
            peers = [sets[r] for r, h in enumerate(homes) if h == node]
            if len(peers) <= len(host.nodes[node]):  # enough CPUs: disjoint
                assert sum(len(p or ()) for p in peers) == len(
                    frozenset().union(*[p or frozenset() for p in peers])
                )


def test_memory_prefers_the_nodes_of_the_bound_cpus() -> None:
    assert memory_nodes(TWO, cpus(8, 11)) == frozenset({1})
    assert memory_nodes(SNC, cpus(0, 7)) == frozenset({0, 1})  # socket: its two nodes
    assert memory_nodes(SNC, bind("socket", SNC, [cpus(4, 7)], cpus(0, 7))[0]) == frozenset({0, 1})
    assert memory_nodes(TWO, bind("exclusive", TWO, [cpus(8, 15)] * 2, ALL)[1]) == frozenset({1})
    assert memory_nodes(TWO, None) is None  # not bound: no policy
    assert memory_nodes(TWO, frozenset({99})) is None
    guessed = Host(nodes={0: ALL}, measured=False)  # sysfs said nothing: node 0 may be wrong
    assert memory_nodes(guessed, cpus(0, 3)) is None


def test_unknown_mode() -> None:
    with pytest.raises(ValueError):
        bind("everywhere", TWO, [frozenset()], ALL)


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == frozenset()
    assert parse_cpulist("3-1") == frozenset() and parse_cpulist("a") == frozenset()


def fake_sysfs(root: Path) -> Path:
    for node, text in ((0, "0-3"), (1, "4-7")):
        d = root / f"devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(text + "\n")
    for cpu in range(8):
        d = root / f"devices/system/cpu/cpu{cpu}"
        (d / "topology").mkdir(parents=True)
        (d / "topology/physical_package_id").write_text(f"{cpu // 4}\n")
        (d / "cache/index3").mkdir(parents=True)
        (d / "cache/index3/shared_cpu_list").write_text("0-3\n" if cpu < 4 else "4-7\n")
        (d / "topology/thread_siblings_list").write_text(f"{cpu - cpu % 2}-{cpu - cpu % 2 + 1}\n")
    dev = root / "bus/pci/devices/0000:11:00.0"
    dev.mkdir(parents=True)
    (dev / "local_cpulist").write_text("4-7\n")
    return root


def test_read_host_from_a_fake_sysfs(tmp_path: Path) -> None:
    host = read_host(fake_sysfs(tmp_path))
    assert host.nodes == {0: cpus(0, 3), 1: cpus(4, 7)} and host.measured
    assert host.sockets == (cpus(0, 3), cpus(4, 7))
    assert host.complexes == (cpus(0, 3), cpus(4, 7))
    assert host.cores == (cpus(0, 1), cpus(2, 3), cpus(4, 5), cpus(6, 7))
    assert device_cpus("00000000:11:00.0", tmp_path) == cpus(4, 7)  # NVML's 8-digit domain
    assert device_cpus("0000:12:00.0", tmp_path) == frozenset()
    assert device_cpus("../../etc", tmp_path) == frozenset()


def test_read_host_with_no_sysfs_is_one_node_of_every_cpu(tmp_path: Path) -> None:
    import os

    host = read_host(tmp_path)
    assert host.nodes == {0: frozenset(os.sched_getaffinity(0))} and not host.measured


def test_rank_cpus_from_nvml_or_sysfs_and_with_a_cpu_limit(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path)
    host = read_host(root)
    nvml: Any = fake.two_sockets(2, cpus_per_socket=4)
    nvml.gpus[1].cpus = ()  # NVML gives none for GPU 1: sysfs' local_cpulist does (4-7)
    inv = inventory_of(*read.read_gpus(nvml))
    every = lambda: set(range(8))  # noqa: E731
    assert rank_cpus("node", host, inv, (0, 1), 2, sysfs=root, allowed=every) == [cpus(0, 3), cpus(4, 7)]
    pinned = rank_cpus("node", host, inv, (1,), 1, cpu_limit=2, pins_cores=True, sysfs=root, allowed=every)
    assert pinned == [frozenset({4, 5})]
    assert rank_cpus(None, host, inv, (0,), 1) == [None]
