"""The host's devices: GPUs through NVML when there are any, CPU slots otherwise.

NVML is read through its seam (``gpu``): the readers take the module as a parameter, so
tests drive them with ``FakeNvml``; no GPU is needed to test this path.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from elasticd import log
from elasticd.gpu.devices import Device, Gpu
from elasticd.gpu.nvml import Nvml
from elasticd.gpu.read import read_gpus
from elasticd.gpu.topology import Link, Topology

_log = log.get("elasticd.inventory")


@dataclass(frozen=True)
class Inventory:
    """``slots`` is what jobs are allocated from: one per GPU (one per MIG slice of a partitioned
    GPU), or CPU slots on a GPU-less host. ``topology`` says how the GPUs are linked."""

    gpus: tuple[Gpu, ...]
    slots: int
    topology: Topology = field(default_factory=Topology)

    @property
    def kind(self) -> str:
        return "gpu" if self.gpus else "cpu"

    @property
    def devices(self) -> tuple[Device, ...]:
        """Slot ``s`` is ``devices[s]``: whole GPUs, and MIG slices for partitioned ones."""
        out: list[Device] = []
        for pos, gpu in enumerate(self.gpus):
            if gpu.mig:
                out.extend(Device(pos, s.uuid, mig=True) for s in gpu.mig)
            else:
                out.append(Device(pos, gpu.uuid))
        return tuple(out)

    def slot_link(self, a: int, b: int) -> Link:
        """How two slots are linked: MIG slices of one GPU as closely as can be, else their GPUs'
        link (``gpu/placement.py`` ranks sets of slots by it)."""
        devices = self.devices
        if not 0 <= a < len(devices) or not 0 <= b < len(devices):
            return Link.SYSTEM
        return self.topology.link(devices[a].gpu, devices[b].gpu)

    def visible_devices(self, slots: tuple[int, ...]) -> str:
        """CUDA_VISIBLE_DEVICES for a job holding ``slots``: GPU indices and MIG UUIDs, or empty on
        a CPU host."""
        if not self.gpus:
            return ""
        devices = self.devices
        return ",".join(
            devices[s].uuid if devices[s].mig else str(self.gpus[devices[s].gpu].index) for s in slots
        )

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "slots": self.slots, "gpus": [asdict(g) for g in self.gpus]}


def fake_gpus(count: int, node_id: str) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-fake-{node_id}-{i}", "Fake GPU", 16384) for i in range(count))


def load_nvml() -> Nvml | None:
    """The real NVML (``pynvml``), or None where it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return cast(Nvml, pynvml)


def discover(
    node_id: str, fake: int | None = None, cpu_slots: int | None = None, nvml: Nvml | None = None
) -> Inventory:
    """Fake GPUs when asked (tests), else NVML (``nvml``, or pynvml when None), else CPU slots
    (``--slots`` or the CPU count)."""
    if fake is not None and fake > 0:
        gpus, topology = fake_gpus(fake, node_id), Topology()
    elif fake is None:
        gpus, topology = _probe(nvml or load_nvml())
    else:
        gpus, topology = (), Topology()
    if gpus:
        return inventory_of(gpus, topology)
    return Inventory((), cpu_slots or os.cpu_count() or 1)


def inventory_of(gpus: tuple[Gpu, ...], topology: Topology | None = None) -> Inventory:
    return Inventory(gpus, sum(len(g.mig) or 1 for g in gpus), topology or Topology())


def _probe(nvml: Nvml | None) -> tuple[tuple[Gpu, ...], Topology]:
    if nvml is None:
        return (), Topology()
    try:
        return read_gpus(nvml)
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no usable GPUs
        _log.info("inventory.no_nvml", reason=str(exc))
        return (), Topology()
