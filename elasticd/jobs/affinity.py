"""Each local rank's CPUs under ``--numa-binding``: the inputs gathered for ``gpu/binding.py``.

The GPU's CPUs come from NVML's affinity (read with the inventory) or, where NVML gave none,
from sysfs' ``local_cpulist`` of its PCI device. The sets are applied in the spawn path as root
before the worker runs (``sched_setaffinity``: ``workers/group.py`` for an exec'd worker,
``workers/warm/zygote.py`` for a forked one, before its go); the memory policy that goes with
them (``gpu/binding.memory_nodes``) is set by the worker's own thread (``workers/numa_memory.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from elasticd.gpu.binding import Host, bind, limited
from elasticd.node.inventory import Inventory
from elasticd.node.numa import device_cpus


def rank_cpus(
    mode: str | None,
    host: Host | None,
    inventory: Inventory,
    slots: tuple[int, ...],
    local_world_size: int,
    cpu_limit: float | None = None,
    pins_cores: bool = False,
    sysfs: Path = Path("/sys"),
    allowed: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
) -> list[frozenset[int] | None]:
    """Each local rank's CPUs (None: not bound). ``pins_cores``: the limits backend pins cores
    for ``cpu_limit`` (no cgroups): they are then taken within the rank's set."""
    if mode is None or host is None:
        return [None] * local_world_size
    gpu_cpus = [_gpu_cpus(inventory, slots, r, sysfs) for r in range(local_world_size)]
    sets = bind(mode, host, gpu_cpus, frozenset(allowed()))
    if cpu_limit is not None and pins_cores:
        return [limited(s, cpu_limit, r) if s else None for r, s in enumerate(sets)]
    return sets


def _gpu_cpus(inventory: Inventory, slots: tuple[int, ...], local_rank: int, sysfs: Path) -> frozenset[int]:
    if not inventory.gpus or local_rank >= len(slots):
        return frozenset()
    gpu = inventory.gpus[inventory.devices[slots[local_rank]].gpu]
    return frozenset(gpu.cpus) or device_cpus(gpu.bus_id, sysfs)
