"""An in-memory NVML: devices whose counters, events, topology and MIG slices a test sets.

It answers the calls of ``api.Nvml`` as pynvml does (bytes or str, ``NVMLError`` with a
``value``, NOT_SUPPORTED for what a device lacks), so that ``read.py`` and the health watcher
run on it unchanged. ``tests/contract/test_contract_nvml.py`` holds it to the same assertions as
the real library. The builders at the end (``dgx_like``, ``pcie_only``, ``two_sockets``) give
the topologies placement is tested on.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from elasticd.gpu import nvml as api

MIB = 1024 * 1024


class FakeNvmlError(Exception):
    """``pynvml.NVMLError``: ``value`` is the ``nvmlReturn_t``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeMig:
    uuid: str
    memory_mib: int = 10240
    name: str = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"


@dataclass
class FakeGpu:
    """One GPU's state; a test changes the fields and the next read sees them."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    bus_id: str = "00000000:00:00.0"
    cpus: tuple[int, ...] = ()  # NVML's ideal CPU affinity (empty: not supported)
    used_mib: int = 0
    utilization: int = 0
    ecc_uncorrected: int = 0
    retired_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    nvlinks: int = 0  # active NVLink links
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter) -> count
    recovery_action: int | None = 0  # None: the driver has no such field
    mig: list[FakeMig] | None = None  # None: MIG disabled
    unsupported: set[str] = field(default_factory=set)  # names of calls that answer NOT_SUPPORTED


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: int | None = None


class FakeNvml:
    """pynvml over ``gpus``. ``ancestor(i, j)`` is the PCIe common ancestor level of two GPUs
    (``api.TOPOLOGY_*``), ``nvlinked`` the pairs joined by NVLink (or one NVSwitch fabric)."""

    NVMLError: type[Exception] = FakeNvmlError

    def __init__(
        self,
        gpus: list[FakeGpu],
        ancestor: dict[frozenset[int], int] | None = None,
        nvlinked: set[frozenset[int]] | None = None,
        fail_on: str | None = None,
    ) -> None:
        self.gpus = gpus
        self.ancestor = ancestor or {}
        self.nvlinked = nvlinked or set()
        self.fail_on = fail_on
        self.calls: list[str] = []  # the latest calls, in order
        self.counts: collections.Counter[str] = collections.Counter()  # every call, by name
        self.initialised = 0
        self._events: queue.Queue[tuple[int, int]] = queue.Queue(maxsize=1024)
        self._registered: set[int] = set()
        self._lock = threading.Lock()

    # -- what a test does -------------------------------------------------------------------------
    def xid(self, index: int, code: int) -> None:
        """The driver reports Xid ``code`` on GPU ``index``: a critical-error event."""
        self._events.put((index, code))

    # -- pynvml -----------------------------------------------------------------------------------
    def _call(self, name: str, handle: _Handle | None = None) -> FakeGpu | None:
        with self._lock:
            self.calls.append(name)
            self.counts[name] += 1
            del self.calls[:-4096]
        if name == self.fail_on:
            raise RuntimeError(f"NVML failure in {name}")
        if name != "nvmlInit" and self.initialised <= 0:
            raise FakeNvmlError(1)  # NVML_ERROR_UNINITIALIZED
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if name in gpu.unsupported:
            raise FakeNvmlError(api.ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise FakeNvmlError(2)  # INVALID_ARGUMENT
        return _Handle(index)

    def _gpu(self, name: str, handle: _Handle) -> FakeGpu:
        gpu = self._call(name, handle)
        assert gpu is not None
        return gpu

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return gpu.uuid if handle.mig is None else self._mig(gpu, handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        gpu = self._gpu("nvmlDeviceGetName", handle)
        return gpu.name if handle.mig is None else self._mig(gpu, handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        total = gpu.memory_mib if handle.mig is None else self._mig(gpu, handle).memory_mib
        return SimpleNamespace(total=total * MIB, used=gpu.used_mib * MIB, free=(total - gpu.used_mib) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=gpu.bus_id.encode())

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpu_set_size: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetCpuAffinity", handle)
        if not gpu.cpus:
            raise FakeNvmlError(api.ERROR_NOT_SUPPORTED)
        words = [0] * cpu_set_size
        for cpu in gpu.cpus:
            if cpu // 64 < cpu_set_size:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def nvmlDeviceGetTopologyCommonAncestor(self, a: _Handle, b: _Handle) -> int:
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", a)
        if a.index == b.index:
            return api.TOPOLOGY_INTERNAL
        return self.ancestor.get(frozenset((a.index, b.index)), api.TOPOLOGY_SYSTEM)

    def nvmlDeviceGetP2PStatus(self, a: _Handle, b: _Handle, index: int) -> int:
        self._gpu("nvmlDeviceGetP2PStatus", a)
        linked = index == api.P2P_CAPS_INDEX_NVLINK and frozenset((a.index, b.index)) in self.nvlinked
        return api.P2P_STATUS_OK if linked else 4  # NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        return gpu.ecc_uncorrected if error_type == api.MEMORY_ERROR_UNCORRECTED else 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return api.FEATURE_ENABLED if gpu.retired_pending else 0

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        return (0, 0, int(gpu.remap_pending), int(gpu.remap_failed))

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if link >= gpu.nvlinks:
            raise FakeNvmlError(api.ERROR_NOT_SUPPORTED)
        return api.FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkErrorCounter", handle)
        return gpu.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[int]) -> list[SimpleNamespace]:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in field_ids:
            known = fid == api.FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None
            ret = api.SUCCESS if known else api.ERROR_NOT_SUPPORTED
            out.append(
                SimpleNamespace(
                    fieldId=fid, nvmlReturn=ret, value=SimpleNamespace(uiVal=gpu.recovery_action or 0)
                )
            )
        return out

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> tuple[int, int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        mode = api.MIG_ENABLED if gpu.mig is not None else 0
        return (mode, mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if gpu.mig is None or not 0 <= index < len(gpu.mig):
            raise FakeNvmlError(api.ERROR_NOT_FOUND)
        return _Handle(handle.index, index)

    def _mig(self, gpu: FakeGpu, handle: _Handle) -> FakeMig:
        assert gpu.mig is not None and handle.mig is not None
        return gpu.mig[handle.mig]

    def nvmlEventSetCreate(self) -> object:
        self._call("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: object) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)
        if event_types & api.EVENT_XID_CRITICAL:
            self._registered.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._call("nvmlEventSetWait_v2")
        while True:
            try:
                index, code = self._events.get(timeout=timeout_ms / 1000)
            except queue.Empty:
                raise FakeNvmlError(api.ERROR_TIMEOUT) from None
            if index in self._registered:
                return SimpleNamespace(
                    device=_Handle(index), eventType=api.EVENT_XID_CRITICAL, eventData=code
                )

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._call("nvmlEventSetFree")


# -- topologies -----------------------------------------------------------------------------------
def _gpus(n: int, node: str, cpus_of: Any, nvlinks: int = 0) -> list[FakeGpu]:
    return [
        FakeGpu(f"GPU-{node}-{i}", bus_id=f"00000000:{0x10 + i:02x}:00.0", cpus=cpus_of(i), nvlinks=nvlinks)
        for i in range(n)
    ]


def _pairs(n: int) -> list[frozenset[int]]:
    return [frozenset(p) for p in itertools.combinations(range(n), 2)]


def two_sockets(n: int = 8, node: str = "fake", cpus_per_socket: int = 4) -> FakeNvml:
    """PCIe only, two sockets: GPUs 0..n/2-1 on socket 0, pairs behind one PCIe switch."""
    half = max(1, n // 2)

    def level(a: int, b: int) -> int:
        if a // half != b // half:
            return api.TOPOLOGY_SYSTEM
        return api.TOPOLOGY_SINGLE if a // 2 == b // 2 else api.TOPOLOGY_NODE

    def cpus(i: int) -> tuple[int, ...]:
        s = i // half
        return tuple(range(s * cpus_per_socket, (s + 1) * cpus_per_socket))

    ancestor = {p: level(*sorted(p)) for p in _pairs(n)}
    return FakeNvml(_gpus(n, node, cpus), ancestor)


def pcie_only(n: int = 4, node: str = "fake") -> FakeNvml:
    """One socket, PCIe switches of two GPUs each, no NVLink."""
    ancestor = {
        p: api.TOPOLOGY_SINGLE if min(p) // 2 == max(p) // 2 else api.TOPOLOGY_HOSTBRIDGE for p in _pairs(n)
    }
    return FakeNvml(_gpus(n, node, lambda i: (0, 1, 2, 3)), ancestor)


def dgx_like(n: int = 8, node: str = "fake", cpus_per_socket: int = 4) -> FakeNvml:
    """Two sockets with PCIe switches (``two_sockets``), every GPU on one NVSwitch fabric."""
    nvml = two_sockets(n, node, cpus_per_socket)
    for gpu in nvml.gpus:
        gpu.nvlinks = 18
    nvml.nvlinked = set(_pairs(n))
    return nvml
