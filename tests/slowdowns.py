"""Slowdowns made from outside a job, as an operator's host or network makes them: a CPU quota on
some processes (a cgroup), CPU hogs competing for the host's cores, and a rate-limited link.

Each is a context manager that removes what it made (the cgroup, the processes, the qdiscs) on the
way out, whatever happened inside.

A slow link is a ``tbf`` qdisc, not ``netem``: the kernels these tests run on have no
``sch_netem``. A token bucket limits the link's rate and queues what exceeds it (up to
``latency``), so a link carrying a collective's bulk data is both slow and late, as a congested
or degraded link is; an idle link (a one-byte ping) goes through at once.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import unique

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup/unified")
PERIOD_US = 20000


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _cpu_group(share: float) -> tuple[Path, Path, dict[str, str]]:
    """(root, group, files to write) of a new CPU cgroup holding its tasks to ``share`` of one CPU,
    in 20 ms periods (the kernel takes no quota under 1 ms); skips the test without one."""
    quota = str(max(1000, int(PERIOD_US * share)))
    if _writable(V1) and (V1 / "cpu.cfs_quota_us").exists():
        files = {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": quota}
        return V1, V1 / unique("elasticd-test"), files
    if _writable(V2) and "cpu" in (V2 / "cgroup.controllers").read_text().split():
        return V2, V2 / unique("elasticd-test"), {"cpu.max": f"{quota} {PERIOD_US}"}
    pytest.skip("no cgroup CPU controller this test may write")


@contextlib.contextmanager
def cpu_quota(pids: list[int], share: float) -> Iterator[Path]:
    """Hold each of ``pids`` (every thread, and what they start from now on) to ``share`` of one CPU
    between them; yields the cgroup. On the way out the processes go back to the root group and
    the cgroup is removed."""
    root, group, files = _cpu_group(share)
    group.mkdir()
    try:
        for name, value in files.items():
            (group / name).write_text(value)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        procs = (group / "cgroup.procs").read_text().split() if group.exists() else []
        for p in procs:
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(p)
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` processes that spin on a CPU each (unpinned: the host's scheduler places them), killed
    and reaped on the way out."""
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            spin = [sys.executable, "-c", "while True: pass"]
            hogs.append(subprocess.Popen(spin, stdin=subprocess.DEVNULL))
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(10)


def _tc(argv: list[str], netns: str | None) -> subprocess.CompletedProcess[str]:
    full = ["ip", "netns", "exec", netns, "tc", *argv] if netns else ["tc", *argv]
    return subprocess.run(full, capture_output=True, text=True, timeout=20)


@contextlib.contextmanager
def link_rate(ends: list[tuple[str | None, str]], mbit: float, latency_ms: float = 50) -> Iterator[None]:
    """Limit each of ``ends`` ((namespace or None for the root one, device)) to ``mbit`` Mbit/s on
    its way out, queueing up to ``latency_ms`` of what exceeds it; the qdiscs are removed on the
    way out (a namespace already gone took its own with it)."""
    made: list[tuple[str | None, str]] = []
    try:
        for netns, dev in ends:
            res = _tc(
                ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
                 "burst", "32kb", "latency", f"{latency_ms}ms"],
                netns,
            )  # fmt: skip
            if res.returncode != 0:
                pytest.skip(f"no tbf qdisc here: {res.stderr.strip()}")
            made.append((netns, dev))
        yield
    finally:
        for netns, dev in made:
            _tc(["qdisc", "del", "dev", dev, "root"], netns)


def qdiscs(netns: str | None, dev: str) -> str:
    """What ``tc`` says of ``dev``'s qdiscs (empty when the device or namespace is gone)."""
    return _tc(["qdisc", "show", "dev", dev], netns).stdout
