"""elasticd.node.allocator.Allocator: disjoint, lowest-first slot allocation."""

from __future__ import annotations

import pytest

from elasticd.node.allocator import Allocator


def test_lowest_slots_first_and_disjoint() -> None:
    a = Allocator(8)
    assert a.allocate("j1", 3) == (0, 1, 2)
    assert a.allocate("j2", 2) == (3, 4)
    assert a.allocate("j3", 3) == (5, 6, 7)
    assert a.free() == []
    held = a.held
    slots = [s for job in held.values() for s in job]
    assert sorted(slots) == list(range(8))
    assert len(set(slots)) == len(slots)


def test_none_when_not_enough_free_and_nothing_changes() -> None:
    a = Allocator(4)
    assert a.allocate("j1", 3) == (0, 1, 2)
    assert a.allocate("j2", 2) is None
    assert "j2" not in a.held
    assert a.free() == [3]


def test_release_frees_and_holes_are_reused_lowest_first() -> None:
    a = Allocator(6)
    a.allocate("j1", 2)
    a.allocate("j2", 2)
    a.allocate("j3", 2)
    a.release("j2")
    assert a.free() == [2, 3]
    assert a.allocate("j4", 1) == (2,)
    a.release("j1")
    assert a.allocate("j5", 3) == (0, 1, 3)  # need not be contiguous


def test_release_unknown_job_is_a_noop() -> None:
    a = Allocator(2)
    a.allocate("j1", 1)
    a.release("nope")
    a.release("j1")
    a.release("j1")
    assert a.free() == [0, 1]
    assert a.held == {}


def test_allocate_is_idempotent_for_the_same_job() -> None:
    a = Allocator(4)
    first = a.allocate("j1", 2)
    assert a.allocate("j1", 2) == first
    assert a.free() == [2, 3]


def test_allocate_whole_host() -> None:
    a = Allocator(4)
    assert a.allocate("j1", 4) == (0, 1, 2, 3)
    assert a.allocate("j2", 1) is None


def test_held_at_construction_is_respected() -> None:
    # after a daemon restart the allocator is rebuilt from the saved job records
    a = Allocator(4, {"old": (1, 2)})
    assert a.free() == [0, 3]
    assert a.allocate("new", 2) == (0, 3)
    assert a.allocate("old", 2) == (1, 2)


def test_held_is_a_copy() -> None:
    a = Allocator(2)
    a.allocate("j1", 1)
    a.held.clear()
    assert a.held == {"j1": (0,)}


@pytest.mark.parametrize(
    ("capacity", "count", "fits"),
    [(4, 1, True), (4, 4, True), (4, 5, False), (4, 0, False), (4, -1, False), (0, 1, False), (1, 1, True)],
)
def test_fits_host(capacity: int, count: int, fits: bool) -> None:
    assert Allocator(capacity).fits_host(count) is fits


def test_fits_host_ignores_current_use() -> None:
    a = Allocator(2)
    a.allocate("j1", 2)
    assert a.fits_host(2)
    assert a.allocate("j2", 2) is None


def test_slots_out_of_the_pool_are_never_handed_out() -> None:
    a = Allocator(4)
    assert a.allocate("j1", 2) == (0, 1)
    a.out = frozenset({1, 2})
    assert a.free() == [3]
    assert a.allocate("j2", 2) is None
    assert a.holders(frozenset({1, 2})) == ["j1"]
    a.release("j1")
    assert a.allocate("j2", 2) == (0, 3)
    a.out = frozenset()
    assert a.free() == [1, 2]


def test_allocation_follows_the_topology() -> None:
    from typing import Any

    from elasticd.gpu import fake, read
    from elasticd.node.inventory import inventory_of

    nvml: Any = fake.two_sockets(8)
    inv = inventory_of(*read.read_gpus(nvml))
    a = Allocator(inv.slots, link=inv.slot_link)
    assert a.allocate("one", 1) == (0,)
    assert a.allocate("pair", 2) == (2, 3)  # a whole PCIe switch, not 1 and 2
    assert a.allocate("quad", 4) == (4, 5, 6, 7)  # one socket
    assert a.allocate("last", 1) == (1,)


def test_slot_link_of_mig_slices() -> None:
    from typing import Any

    from elasticd.gpu import fake, read
    from elasticd.gpu.topology import Link
    from elasticd.node.inventory import inventory_of

    f = fake.two_sockets(4)
    f.gpus[3].mig = [fake.FakeMig("MIG-a"), fake.FakeMig("MIG-b")]
    nvml: Any = f
    inv = inventory_of(*read.read_gpus(nvml))
    assert inv.slots == 5
    assert inv.slot_link(3, 4) is Link.NVLINK  # two slices of one GPU
    assert inv.slot_link(2, 3) is Link.PCIE_SWITCH  # GPU 2 and a slice of GPU 3
    assert inv.slot_link(0, 9) is Link.SYSTEM


def test_a_whole_gpu_job_never_lands_on_a_partitioned_gpu_nor_a_mig_job_on_a_whole_one() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    @given(
        st.lists(st.booleans(), min_size=1, max_size=8), st.lists(st.tuples(st.integers(1, 4), st.booleans()))
    )
    def check(kinds: list[bool], jobs: list[tuple[int, bool]]) -> None:
        a = Allocator(len(kinds), mig=kinds)
        for i, (count, mig) in enumerate(jobs):
            got = a.allocate(f"j{i}", count, mig)
            if got is not None:
                assert all(kinds[s] == mig for s in got)
        taken = [s for slots in a.held.values() for s in slots]
        assert len(taken) == len(set(taken))

    check()
    a = Allocator(4, mig=[False, True, True, False])
    assert a.allocate("whole", 2) == (0, 3)
    assert a.allocate("mig", 2, mig=True) == (1, 2)
    assert a.free(mig=False) == [] and a.allocate("more", 1) is None
