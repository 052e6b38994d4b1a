"""The bound on a job's memory snapshots a node derives from its memory, and where it came from."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from elasticd.jobs import snapshotspace
from elasticd.node import hostmemory
from elasticd.node.snapshotbound import (
    CAP,
    FLOOR,
    BoundSource,
    HostMemory,
    SnapshotBound,
    bound_of,
    derive,
    parse_meminfo,
)

GIB = 1 << 30
SIZES = st.one_of(st.none(), st.integers(-(1 << 20), 1 << 50))


def test_a_plain_host_gets_half_of_its_dev_shm() -> None:
    # Linux's default /dev/shm is half of RAM: the bound is then a quarter of RAM
    assert derive(HostMemory(64 * GIB, 32 * GIB, 32 * GIB)) == 16 * GIB
    # what /dev/shm already holds is not ours
    assert derive(HostMemory(64 * GIB, 32 * GIB, 8 * GIB)) == 4 * GIB
    # a /dev/shm as large as RAM: half of RAM
    assert derive(HostMemory(24 * GIB, 24 * GIB, 24 * GIB)) == 12 * GIB


def test_a_small_or_unknown_host_gets_no_snapshots() -> None:
    assert derive(HostMemory(64 * GIB, 64 << 20, 64 << 20)) == 0  # Docker's default /dev/shm
    assert derive(HostMemory(64 * GIB, None, None)) == 0  # no /dev/shm
    assert derive(HostMemory(None, 32 * GIB, 32 * GIB)) == 0  # no /proc/meminfo
    assert derive(HostMemory(64 * GIB, 32 * GIB, 0)) == 0  # a full /dev/shm
    assert derive(HostMemory(2 * FLOOR, 2 * FLOOR, 2 * FLOOR)) == FLOOR
    assert derive(HostMemory(2 * FLOOR - 2, 2 * FLOOR, 2 * FLOOR)) == 0


def test_a_very_large_host_is_capped() -> None:
    assert derive(HostMemory(4096 * GIB, 2048 * GIB, 2048 * GIB)) == CAP


@given(SIZES, SIZES, SIZES)
def test_the_derived_bound_fits_dev_shm_and_is_zero_or_meaningful(
    mem: int | None, size: int | None, free: int | None
) -> None:
    bound = derive(HostMemory(mem, size, free))
    assert bound == 0 or FLOOR <= bound <= CAP
    if bound:
        assert mem is not None and size is not None and free is not None
        assert bound <= min(mem, size, free) // 2
        assert snapshotspace.refusal(bound, size, "n1") is None  # a derived bound is never refused


@given(st.one_of(st.none(), st.integers(0, 1 << 44)), SIZES)
def test_a_set_bound_is_used_as_is(setting: int | None, shm: int | None) -> None:
    host = HostMemory(64 * GIB, shm, shm)
    bound = bound_of(setting, host)
    if setting is None:
        assert bound == SnapshotBound(derive(host), BoundSource.DERIVED)
    else:
        assert bound == SnapshotBound(setting, BoundSource.SET)  # 0 turns them off


def test_meminfo_is_parsed_strictly() -> None:
    assert parse_meminfo("MemFree:  10 kB\nMemTotal:       24683568 kB\n") == 24683568 * 1024
    for bad in ("", "MemTotal: 12 MB\n", "MemTotal: -1 kB\n", "MemTotal: 1e9 kB\n", "MemTotal:\n"):
        assert parse_meminfo(bad) is None


def test_the_host_is_read_once_thinly(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1024 kB\n")
    host = hostmemory.read(str(meminfo), str(tmp_path))
    st_ = os.statvfs(tmp_path)
    assert host == HostMemory(1 << 20, st_.f_blocks * st_.f_frsize, host.shm_free)
    assert host.shm_free is not None and 0 <= host.shm_free <= st_.f_blocks * st_.f_frsize
    assert hostmemory.read(str(tmp_path / "none"), str(tmp_path / "none")) == HostMemory(None, None, None)
