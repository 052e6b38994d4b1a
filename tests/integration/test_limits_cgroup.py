"""Per-worker limits with this host's real cgroup backend: OOM kills are recognised, files hold the limits.

Runs as root where a cgroup hierarchy is writable (v1 or v2). The daemon's move into
``elasticd.daemon`` is disabled (``move_self=False``): the test must not move pytest itself.
Every cgroup a test creates lives under an instance directory of its own, removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticd.workers.cgroups.hierarchy import detect
from elasticd.workers.cgroups.limits import LimitBackend, Placement, ResourceLimits

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

MiB = 1 << 20
ALLOCATE = (
    "import sys\n"
    "chunks = []\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    chunks.append(b'x' * (1 << 20))  # 1 MB, every page written\n"
    "print('allocated', len(chunks))\n"
)
SHOW = (
    "import os, resource\n"
    "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    "print(open('/proc/self/cgroup').read())\n"
)


def bases_of(backend: LimitBackend) -> tuple[Path, ...]:
    bases: tuple[Path, ...] = getattr(backend, "bases", ())
    return bases


@pytest.fixture
def backend() -> Iterator[LimitBackend]:
    """The detected backend under a fresh instance directory; teardown asserts nothing is left."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    found = detect(instance=f"test-{os.getpid()}-{secrets.token_hex(3)}", move_self=False)
    if found.name == "rlimit":
        pytest.skip("no writable cgroup hierarchy on this host")
    bases = bases_of(found)
    try:
        yield found
    finally:
        leftovers = [str(p) for base in bases if base.is_dir() for p in base.iterdir() if p.is_dir()]
        found.sweep(())
        for base in bases:
            for directory in (base, base.parent):  # the instance, then the shared elasticd dir if empty
                with contextlib.suppress(OSError):
                    directory.rmdir()
        assert not leftovers, f"cgroups left behind: {leftovers}"
        assert not [b for b in bases if b.exists()]


def run(placement: Placement, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        preexec_fn=placement.preexec,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def job_id() -> str:
    return f"lim-{secrets.token_hex(4)}"


def control(placement: Placement, *names: str) -> dict[str, str]:
    """The first of ``names`` found in each of the placement's leaves, by name."""
    found = {}
    for leaf in placement.cgroups:
        for name in names:
            if (leaf / name).exists():
                found[name] = (leaf / name).read_text().strip()
    return found


def test_over_the_memory_limit_is_oom_killed(backend: LimitBackend) -> None:
    placement = backend.place(job_id(), 0, ResourceLimits(memory_bytes=64 * MiB))
    try:
        result = run(placement, ALLOCATE, "400")
        assert result.returncode == -signal.SIGKILL, result
        assert placement.oom_killed()
    finally:
        placement.close()
    assert placement.oom_killed()  # still known after the cgroup is gone
    assert not any(leaf.exists() for leaf in placement.cgroups)


def test_under_the_limit_exits_zero(backend: LimitBackend) -> None:
    placement = backend.place(job_id(), 0, ResourceLimits(memory_bytes=256 * MiB))
    try:
        result = run(placement, ALLOCATE, "32")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "allocated 32"
        assert not placement.oom_killed()
    finally:
        placement.close()


def test_memory_limit_file(backend: LimitBackend) -> None:
    placement = backend.place(job_id(), 3, ResourceLimits(memory_bytes=64 * MiB))
    try:
        assert control(placement, "memory.max", "memory.limit_in_bytes") in (
            {"memory.max": str(64 * MiB)},
            {"memory.limit_in_bytes": str(64 * MiB)},
        )
        memsw = control(placement, "memory.memsw.limit_in_bytes", "memory.swap.max")
        assert set(memsw.values()) <= {str(64 * MiB), "0"}
    finally:
        placement.close()


def test_nofile_and_membership_visible_in_the_child(backend: LimitBackend) -> None:
    job = job_id()
    placement = backend.place(job, 1, ResourceLimits(memory_bytes=256 * MiB, cpus=1.0, nofile=200))
    try:
        result = run(placement, SHOW)
        assert result.returncode == 0, result.stderr
        rlimit, _, cgroups = result.stdout.partition("\n")
        assert rlimit == "(200, 200)"
        joined = [line for line in cgroups.splitlines() if line.endswith(f"/{job}/rank_1")]
        assert len(joined) == len(placement.cgroups) >= 1, cgroups
    finally:
        placement.close()


def test_cpu_quota_file(backend: LimitBackend) -> None:
    placement = backend.place(job_id(), 0, ResourceLimits(cpus=0.5))
    try:
        quota = control(placement, "cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us")
        if not quota:
            pytest.skip("no cpu hierarchy here: CPU limits pin cores instead")
        assert quota in (
            {"cpu.max": "50000 100000"},
            {"cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000"},
        )
    finally:
        placement.close()


def test_close_removes_every_directory(backend: LimitBackend) -> None:
    job = job_id()
    placements = [backend.place(job, rank, ResourceLimits(memory_bytes=64 * MiB, cpus=1)) for rank in (0, 1)]
    job_dirs = {leaf.parent for p in placements for leaf in p.cgroups}
    assert job_dirs and all(d.is_dir() for d in job_dirs)
    placements[0].close()
    assert all(d.is_dir() for d in job_dirs)  # rank 1 still holds the job's directory
    placements[1].close()
    placements[1].close()
    assert not [d for d in job_dirs if d.exists()]


def test_sweep_removes_a_predecessors_leftovers(backend: LimitBackend) -> None:
    dead, live = job_id(), job_id()
    orphan = backend.place(dead, 0, ResourceLimits(memory_bytes=64 * MiB))  # never closed: a crash
    kept = backend.place(live, 0, ResourceLimits(memory_bytes=64 * MiB))
    try:
        removed = backend.sweep({live})
        assert {p.name for p in removed} == {dead}
        assert not any(leaf.exists() for leaf in orphan.cgroups)
        assert all(leaf.exists() for leaf in kept.cgroups)
    finally:
        orphan.close()  # its directories are gone already: tolerated
        kept.close()
