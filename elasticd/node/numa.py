"""This host's NUMA layout from sysfs: nodes and their CPUs, sockets, core complexes (CPUs that
share an L3 cache) and a PCI device's ``local_cpulist``. ``root`` is ``/sys`` but for tests,
which fake it. Read once at start; anything missing reads as one node holding every CPU (a guess:
no memory policy names it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from elasticd.gpu.binding import Host

MAX_CPUS = 1 << 16
_NODE = re.compile(r"^node(\d+)$")
_CPU = re.compile(r"^cpu(\d+)$")


def parse_cpulist(text: str) -> frozenset[int]:
    """``0-3,8,10-11`` as a set (a bad list reads as empty)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return frozenset()
        lo, hi = int(first), int(last or first)
        if not 0 <= lo <= hi < MAX_CPUS:
            return frozenset()
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_host(root: Path = Path("/sys")) -> Host:
    """The host's NUMA nodes, sockets and core complexes (every CPU of one node when sysfs says
    nothing, e.g. in a container that hides it)."""
    nodes: dict[int, frozenset[int]] = {}
    node_dir = root / "devices/system/node"
    for entry in sorted(os.listdir(node_dir)) if node_dir.is_dir() else []:
        m = _NODE.match(entry)
        text = _read(node_dir / entry / "cpulist") if m else None
        if m and text is not None and (cpus := parse_cpulist(text)):
            nodes[int(m.group(1))] = cpus
    sockets: dict[int, set[int]] = {}
    complexes: set[frozenset[int]] = set()
    cores: set[frozenset[int]] = set()
    cpu_dir = root / "devices/system/cpu"
    for entry in sorted(os.listdir(cpu_dir)) if cpu_dir.is_dir() else []:
        m = _CPU.match(entry)
        if not m:
            continue
        cpu = int(m.group(1))
        package = _read(cpu_dir / entry / "topology/physical_package_id")
        if package is not None and package.strip().lstrip("-").isdigit():
            sockets.setdefault(int(package), set()).add(cpu)
        siblings = _read(cpu_dir / entry / "topology/thread_siblings_list")
        if siblings is not None and (threads := parse_cpulist(siblings)):
            cores.add(threads)
        l3 = _read(cpu_dir / entry / "cache/index3/shared_cpu_list")
        if l3 is not None and (shared := parse_cpulist(l3)):
            complexes.add(shared)
    measured = bool(nodes)
    if not measured:
        every = frozenset(os.sched_getaffinity(0))
        nodes = {0: every}
    return Host(
        nodes=nodes,
        sockets=tuple(frozenset(s) for _, s in sorted(sockets.items())),
        complexes=tuple(sorted(complexes, key=min)),
        cores=tuple(sorted(cores, key=min)),
        measured=measured,
    )


def device_cpus(bus_id: str, root: Path = Path("/sys")) -> frozenset[int]:
    """A PCI device's ``local_cpulist`` (the CPUs of its NUMA node); empty when unknown."""
    name = bus_id.lower()
    if name.count(":") == 2 and len(name.split(":")[0]) == 8:  # NVML's 8-digit domain
        name = name[4:]
    if not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", name):
        return frozenset()
    text = _read(root / "bus/pci/devices" / name / "local_cpulist")
    return parse_cpulist(text) if text is not None else frozenset()
