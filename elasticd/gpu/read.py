"""Readings through the NVML seam: the inventory (with topology and MIG), health counters, usage.

Every reading a device may not support (ECC on a consumer card, row remapping before Ampere,
NVLink on PCIe cards, the recovery-action field on older drivers) reads as None rather than
failing: the health decider judges what there is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from elasticd.gpu import nvml as api
from elasticd.gpu.devices import Gpu, MigSlice
from elasticd.gpu.nvml import Nvml, text
from elasticd.gpu.topology import Link, Topology

T = TypeVar("T")
MIB = 1024 * 1024
MAX_GPUS = 64  # a bound on what one host's record carries
MAX_MIG = 8


@dataclass(frozen=True)
class Counters:
    """One GPU's health counters (None: not supported here)."""

    ecc_uncorrected: int | None = None  # volatile uncorrectable ECC errors since the driver loaded
    retired_pending: bool | None = None  # a page waits to be retired (pre-Ampere)
    remap_pending: bool | None = None  # a row waits to be remapped: the GPU needs a reset
    remap_failed: bool | None = None  # a remap failed: the GPU must be replaced
    nvlink_errors: int | None = None  # replay, recovery and CRC errors summed over active links
    recovery_action: int | None = None  # the driver's advice (``api.RECOVERY_ACTIONS``), 0 for none


@dataclass(frozen=True)
class Usage:
    memory_used_mib: int | None = None
    utilization_pct: int | None = None


@contextmanager
def session(nvml: Nvml) -> Iterator[Nvml]:
    """``nvmlInit`` ... ``nvmlShutdown`` (NVML counts them: nested sessions are fine)."""
    nvml.nvmlInit()
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def optional(nvml: Nvml, call: Callable[[], T]) -> T | None:
    """``call()``, or None when NVML says the device does not support it (or cannot answer)."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def handles(nvml: Nvml) -> list[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(min(nvml.nvmlDeviceGetCount(), MAX_GPUS))]


def read_gpus(nvml: Nvml) -> tuple[tuple[Gpu, ...], Topology]:
    """Every GPU with its bus id, CPU affinity and MIG slices, and how each pair is linked."""
    with session(nvml):
        hs = handles(nvml)
        gpus = tuple(_gpu(nvml, i, h) for i, h in enumerate(hs))
        return gpus, read_topology(nvml, hs)


def _gpu(nvml: Nvml, index: int, handle: Any) -> Gpu:
    pci = optional(nvml, lambda: nvml.nvmlDeviceGetPciInfo(handle))
    return Gpu(
        index=index,
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        name=text(nvml.nvmlDeviceGetName(handle)),
        memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
        bus_id=text(pci.busId) if pci is not None else "",
        cpus=cpu_affinity(nvml, handle),
        mig=read_mig(nvml, handle),
    )


def cpu_affinity(nvml: Nvml, handle: Any) -> tuple[int, ...]:
    """The CPUs NVML deems closest to the GPU (its NUMA node's), from a bitmask of 64-bit words."""
    words_n = ((os.cpu_count() or 1) + 63) // 64
    words = optional(nvml, lambda: nvml.nvmlDeviceGetCpuAffinity(handle, words_n))
    if words is None:
        return ()
    return tuple(w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1)


def read_mig(nvml: Nvml, handle: Any) -> tuple[MigSlice, ...]:
    """The GPU's MIG devices, or () when MIG is off (or not supported)."""
    mode = optional(nvml, lambda: nvml.nvmlDeviceGetMigMode(handle))
    if mode is None or int(mode[0]) != api.MIG_ENABLED:
        return ()
    slices = []
    for i in range(min(optional(nvml, lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0, MAX_MIG)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:
            continue  # an index with no instance (NOT_FOUND)
        total = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // MIB
        slices.append(MigSlice(text(nvml.nvmlDeviceGetUUID(mig)), text(nvml.nvmlDeviceGetName(mig)), total))
    return tuple(slices)


_LEVELS = {
    api.TOPOLOGY_INTERNAL: Link.PCIE_SWITCH,
    api.TOPOLOGY_SINGLE: Link.PCIE_SWITCH,
    api.TOPOLOGY_MULTIPLE: Link.PCIE_SWITCH,
    api.TOPOLOGY_HOSTBRIDGE: Link.HOSTBRIDGE,
    api.TOPOLOGY_NODE: Link.SOCKET,
}


def pair_link(nvml: Nvml, a: Any, b: Any) -> Link:
    nvlink = optional(nvml, lambda: nvml.nvmlDeviceGetP2PStatus(a, b, api.P2P_CAPS_INDEX_NVLINK))
    if nvlink == api.P2P_STATUS_OK:
        return Link.NVLINK
    level = optional(nvml, lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    return _LEVELS.get(level if level is not None else api.TOPOLOGY_SYSTEM, Link.SYSTEM)


def read_topology(nvml: Nvml, hs: list[Any]) -> Topology:
    n = len(hs)
    links = [[Link.NVLINK] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            links[i][j] = links[j][i] = pair_link(nvml, hs[i], hs[j])
    return Topology(tuple(tuple(row) for row in links))


def read_counters(nvml: Nvml, handle: Any) -> Counters:
    """The health counters the decider judges (``node/gpuhealth.py``)."""
    ecc = optional(
        nvml, lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, api.MEMORY_ERROR_UNCORRECTED, api.VOLATILE_ECC)
    )
    retired = optional(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    rows = optional(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    return Counters(
        ecc_uncorrected=int(ecc) if ecc is not None else None,
        retired_pending=int(retired) == api.FEATURE_ENABLED if retired is not None else None,
        remap_pending=bool(rows[2]) if rows is not None else None,
        remap_failed=bool(rows[3]) if rows is not None else None,
        nvlink_errors=nvlink_errors(nvml, handle),
        recovery_action=recovery_action(nvml, handle),
    )


_NVLINK_COUNTERS = (
    api.NVLINK_ERROR_DL_REPLAY,
    api.NVLINK_ERROR_DL_RECOVERY,
    api.NVLINK_ERROR_DL_CRC_FLIT,
    api.NVLINK_ERROR_DL_CRC_DATA,
)


def nvlink_errors(nvml: Nvml, handle: Any) -> int | None:
    """Replay, recovery and CRC errors summed over the active links (None: no active link)."""
    total: int | None = None
    for link in range(api.NVLINK_MAX_LINKS):
        if _optional_int(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link) != api.FEATURE_ENABLED:
            continue
        for counter in _NVLINK_COUNTERS:
            count = _optional_int(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            if count is not None:
                total = (total or 0) + count
    return total


def _optional_int(nvml: Nvml, call: Callable[..., int], *args: Any) -> int | None:
    try:
        return int(call(*args))
    except nvml.NVMLError:
        return None


def recovery_action(nvml: Nvml, handle: Any) -> int | None:
    values = optional(
        nvml, lambda: nvml.nvmlDeviceGetFieldValues(handle, [api.FI_DEV_GET_GPU_RECOVERY_ACTION])
    )
    if not values or int(values[0].nvmlReturn) != api.SUCCESS:
        return None
    return int(values[0].value.uiVal)


def read_usage(nvml: Nvml, handle: Any) -> Usage:
    memory = optional(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    util = optional(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    return Usage(
        memory_used_mib=int(memory.used) // MIB if memory is not None else None,
        utilization_pct=int(util.gpu) if util is not None else None,
    )
