"""The host's devices: GPUs through NVML when there are any, CPU slots otherwise.

The NVML calls are kept thin (``read_nvml``) and take the module as a parameter, so that tests
drive them with a fake module; no GPU is needed to test this path.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from elasticd import log

_log = log.get("elasticd.inventory")


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int


@dataclass(frozen=True)
class Inventory:
    """``slots`` is what jobs are allocated from: one per GPU, or CPU slots on a GPU-less host."""

    gpus: tuple[Gpu, ...]
    slots: int

    @property
    def kind(self) -> str:
        return "gpu" if self.gpus else "cpu"

    def visible_devices(self, slots: tuple[int, ...]) -> str:
        """CUDA_VISIBLE_DEVICES for a job holding ``slots``: GPU indices, or empty on a CPU host."""
        if not self.gpus:
            return ""
        return ",".join(str(self.gpus[s].index) for s in slots)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "slots": self.slots, "gpus": [asdict(g) for g in self.gpus]}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(nvml: ModuleType) -> tuple[Gpu, ...]:
    """Enumerate GPUs with an NVML module (``pynvml`` from nvidia-ml-py, or a fake)."""
    nvml.nvmlInit()
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                Gpu(
                    index=i,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                )
            )
        return tuple(gpus)
    finally:
        nvml.nvmlShutdown()


def fake_gpus(count: int, node_id: str) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-fake-{node_id}-{i}", "Fake GPU", 16384) for i in range(count))


def discover(node_id: str, fake: int | None = None, cpu_slots: int | None = None) -> Inventory:
    """Fake GPUs when asked (tests), else NVML, else CPU slots (``--slots`` or the CPU count)."""
    if fake is not None and fake > 0:
        gpus = fake_gpus(fake, node_id)
    else:
        gpus = _probe_nvml() if fake is None else ()
    if gpus:
        return Inventory(gpus, len(gpus))
    return Inventory((), cpu_slots or os.cpu_count() or 1)


def _probe_nvml() -> tuple[Gpu, ...]:
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        return read_nvml(pynvml)
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no usable GPUs
        _log.info("inventory.no_nvml", reason=str(exc))
        return ()
