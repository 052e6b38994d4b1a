"""A GPU and its MIG slices as the inventory records them. Pure data, below every reader."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigSlice:
    """A MIG device: a slot of its own, named by its ``MIG-...`` UUID in CUDA_VISIBLE_DEVICES."""

    uuid: str
    name: str
    memory_mib: int


@dataclass(frozen=True)
class Gpu:
    """``index`` is NVML's (and CUDA's, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); ``cpus`` the CPUs
    NVML deems closest (its NUMA node's); ``mig`` its slices when MIG is on (then the GPU itself is
    never a slot: a whole-GPU job never lands on a partitioned GPU)."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    bus_id: str = ""
    cpus: tuple[int, ...] = ()
    mig: tuple[MigSlice, ...] = ()


@dataclass(frozen=True)
class Device:
    """One slot of a GPU host: a whole GPU or one MIG slice of it (``gpu`` is its position)."""

    gpu: int
    uuid: str
    mig: bool = False
