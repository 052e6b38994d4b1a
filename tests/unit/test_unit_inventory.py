"""elasticd.node.inventory: NVML enumeration with a fake module, discovery, visible devices."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.node import inventory
from elasticd.node.inventory import Gpu, Inventory, discover, fake_gpus, read_nvml

MIB = 1024 * 1024


class FakeNvml:
    """The subset of pynvml that read_nvml uses; records calls."""

    def __init__(self, devices: list[tuple[Any, Any, int]], fail_on: str | None = None) -> None:
        self.devices = devices  # (uuid, name, total bytes)
        self.fail_on = fail_on
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_on:
            raise RuntimeError(f"NVML failure in {name}")

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> Any:
        self._call("nvmlDeviceGetUUID")
        return self.devices[handle][0]

    def nvmlDeviceGetName(self, handle: int) -> Any:
        self._call("nvmlDeviceGetName")
        return self.devices[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=self.devices[handle][2], free=0, used=0)


TWO_GPUS: list[tuple[Any, Any, int]] = [
    (b"GPU-aaaa", b"NVIDIA A100-SXM4-80GB", 80 * 1024 * MIB),  # older pynvml returns bytes
    ("GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559 * MIB + 123),  # newer returns str
]


def test_read_nvml_bytes_and_str() -> None:
    nvml = FakeNvml(TWO_GPUS)
    gpus = read_nvml(nvml)  # type: ignore[arg-type]
    assert gpus == (
        Gpu(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 80 * 1024),
        Gpu(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559),
    )
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"
    assert nvml.calls.count("nvmlShutdown") == 1


def test_read_nvml_no_devices() -> None:
    nvml = FakeNvml([])
    assert read_nvml(nvml) == ()  # type: ignore[arg-type]
    assert nvml.calls == ["nvmlInit", "nvmlDeviceGetCount", "nvmlShutdown"]


@pytest.mark.parametrize(
    "fail_on",
    [
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo",
    ],
)
def test_read_nvml_shuts_down_when_a_call_raises(fail_on: str) -> None:
    nvml = FakeNvml(TWO_GPUS, fail_on=fail_on)
    with pytest.raises(RuntimeError, match=fail_on):
        read_nvml(nvml)  # type: ignore[arg-type]
    assert nvml.calls[-1] == "nvmlShutdown"


def test_read_nvml_init_failure_propagates() -> None:
    nvml = FakeNvml(TWO_GPUS, fail_on="nvmlInit")
    with pytest.raises(RuntimeError):
        read_nvml(nvml)  # type: ignore[arg-type]
    assert "nvmlDeviceGetCount" not in nvml.calls


def test_read_nvml_with_simple_namespace() -> None:
    shutdown: list[bool] = []
    nvml = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: shutdown.append(True),
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: "GPU-x",
        nvmlDeviceGetName=lambda h: b"Tesla T4",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=15360 * MIB),
    )
    assert read_nvml(nvml) == (Gpu(0, "GPU-x", "Tesla T4", 15360),)  # type: ignore[arg-type]
    assert shutdown == [True]


def _no_nvml_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> tuple[Gpu, ...]:
        raise AssertionError("NVML must not be probed")

    monkeypatch.setattr(inventory, "_probe_nvml", boom)


def test_discover_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_nvml_probe(monkeypatch)
    inv = discover("node-a", fake=3, cpu_slots=16)
    assert inv.kind == "gpu"
    assert inv.slots == 3
    assert inv.gpus == fake_gpus(3, "node-a")
    assert [g.index for g in inv.gpus] == [0, 1, 2]
    assert len({g.uuid for g in inv.gpus}) == 3
    assert all("node-a" in g.uuid for g in inv.gpus)


def test_discover_fake_zero_gives_cpu_slots_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_nvml_probe(monkeypatch)
    inv = discover("n", fake=0, cpu_slots=5)
    assert (inv.kind, inv.gpus, inv.slots) == ("cpu", (), 5)


@pytest.mark.parametrize(("cpu_count", "slots"), [(12, 12), (None, 1)])
def test_discover_cpu_slots_default_to_cpu_count(
    monkeypatch: pytest.MonkeyPatch, cpu_count: int | None, slots: int
) -> None:
    _no_nvml_probe(monkeypatch)
    monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
    assert discover("n", fake=0).slots == slots


def test_discover_uses_pynvml_when_not_faked(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(TWO_GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = discover("n", fake=None, cpu_slots=7)
    assert inv.kind == "gpu"
    assert inv.slots == 2
    assert [g.uuid for g in inv.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert fake.calls[-1] == "nvmlShutdown"


def test_discover_pynvml_with_zero_devices_gives_cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    inv = discover("n", cpu_slots=7)
    assert (inv.kind, inv.slots) == ("cpu", 7)


@pytest.mark.parametrize("fail_on", ["nvmlInit", "nvmlDeviceGetName"])
def test_discover_nvml_failure_gives_cpu_slots(monkeypatch: pytest.MonkeyPatch, fail_on: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(TWO_GPUS, fail_on=fail_on))
    inv = discover("n", cpu_slots=3)
    assert (inv.kind, inv.gpus, inv.slots) == ("cpu", (), 3)


def test_discover_without_pynvml_installed_gives_cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    inv = discover("n", cpu_slots=2)
    assert (inv.kind, inv.slots) == ("cpu", 2)


@pytest.mark.parametrize(
    ("slots", "expected"),
    [((), ""), ((0,), "0"), ((1, 3), "1,3"), ((0, 1, 2, 3), "0,1,2,3")],
)
def test_visible_devices_on_gpu_host(slots: tuple[int, ...], expected: str) -> None:
    inv = Inventory(fake_gpus(4, "n"), 4)
    assert inv.visible_devices(slots) == expected


def test_visible_devices_use_gpu_indices() -> None:
    inv = Inventory((Gpu(2, "GPU-2", "x", 1), Gpu(5, "GPU-5", "x", 1)), 2)
    assert inv.visible_devices((1,)) == "5"
    assert inv.visible_devices((0, 1)) == "2,5"


@pytest.mark.parametrize("slots", [(), (0,), (0, 1, 2)])
def test_visible_devices_on_cpu_host_is_empty(slots: tuple[int, ...]) -> None:
    assert Inventory((), 8).visible_devices(slots) == ""


def test_to_json() -> None:
    assert Inventory((), 4).to_json() == {"kind": "cpu", "slots": 4, "gpus": []}
    gpu = Inventory((Gpu(0, "GPU-0", "T4", 15360),), 1).to_json()
    assert gpu == {
        "kind": "gpu",
        "slots": 1,
        "gpus": [{"index": 0, "uuid": "GPU-0", "name": "T4", "memory_mib": 15360}],
    }
