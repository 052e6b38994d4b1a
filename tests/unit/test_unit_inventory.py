"""elasticd.node.inventory and gpu/read.py: NVML reads on the fake, discovery, slots."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from elasticd.gpu import fake, read
from elasticd.gpu.devices import Gpu, MigSlice
from elasticd.gpu.fake import FakeGpu, FakeMig, FakeNvml
from elasticd.gpu.topology import Link, Topology
from elasticd.node import inventory
from elasticd.node.inventory import Inventory, discover, fake_gpus, inventory_of


def two() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("GPU-aaaa", "NVIDIA A100-SXM4-80GB", 80 * 1024),
            FakeGpu("GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559),
        ]
    )


def test_read_gpus() -> None:
    nvml: Any = two()
    gpus, topology = read.read_gpus(nvml)
    assert [(g.index, g.uuid, g.name, g.memory_mib) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 80 * 1024),
        (1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559),
    ]
    assert topology.link(0, 1) is Link.SYSTEM
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert nvml.initialised == 0


def test_read_gpus_bytes_from_older_pynvml() -> None:
    f = two()
    nvml: Any = f
    real_uuid = f.nvmlDeviceGetUUID
    setattr(f, "nvmlDeviceGetUUID", lambda h: real_uuid(h).encode())  # noqa: B010 (a str method made to answer bytes)
    gpus, _ = read.read_gpus(nvml)
    assert gpus[0].uuid == "GPU-aaaa"


@pytest.mark.parametrize("fail_on", ["nvmlDeviceGetCount", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo"])
def test_read_gpus_shuts_down_when_a_call_raises(fail_on: str) -> None:
    nvml: Any = FakeNvml(two().gpus, fail_on=fail_on)
    with pytest.raises(RuntimeError, match=fail_on):
        read.read_gpus(nvml)
    assert nvml.calls[-1] == "nvmlShutdown" and nvml.initialised == 0


def test_topologies() -> None:
    dgx: Any = fake.dgx_like(8)
    _, t = read.read_gpus(dgx)
    assert t.worst(tuple(range(8))) is Link.NVLINK
    two_s: Any = fake.two_sockets(8)
    _, t = read.read_gpus(two_s)
    assert (t.link(0, 1), t.link(0, 2), t.link(0, 4)) == (Link.PCIE_SWITCH, Link.SOCKET, Link.SYSTEM)
    pcie: Any = fake.pcie_only(4)
    _, t = read.read_gpus(pcie)
    assert (t.link(2, 3), t.link(1, 2)) == (Link.PCIE_SWITCH, Link.HOSTBRIDGE)


def test_cpu_affinity_and_bus_id() -> None:
    nvml: Any = fake.two_sockets(4, cpus_per_socket=3)
    gpus, _ = read.read_gpus(nvml)
    assert [g.cpus for g in gpus] == [(0, 1, 2), (0, 1, 2), (3, 4, 5), (3, 4, 5)]
    assert gpus[1].bus_id == "00000000:11:00.0"


def test_cpu_affinity_unsupported_is_empty() -> None:
    nvml: Any = FakeNvml([FakeGpu("GPU-x")])
    gpus, _ = read.read_gpus(nvml)
    assert gpus[0].cpus == ()


def test_mig_slices_are_slots_and_visible_by_uuid() -> None:
    f = fake.pcie_only(2)
    f.gpus[1].mig = [FakeMig("MIG-a"), FakeMig("MIG-b", memory_mib=20480)]
    nvml: Any = f
    gpus, topology = read.read_gpus(nvml)
    assert gpus[1].mig == (
        MigSlice("MIG-a", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10240),
        MigSlice("MIG-b", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 20480),
    )
    inv = inventory_of(gpus, topology)
    assert inv.slots == 3
    assert [d.mig for d in inv.devices] == [False, True, True]
    assert inv.visible_devices((0, 1, 2)) == "0,MIG-a,MIG-b"


def test_counters() -> None:
    f = fake.dgx_like(2)
    g = f.gpus[0]
    g.ecc_uncorrected, g.remap_pending, g.recovery_action = 3, True, 2
    g.nvlink_errors = {(0, 1): 2, (5, 3): 4, (30, 3): 100}  # link 30 is beyond the active ones
    nvml: Any = f
    with read.session(nvml):
        c = read.read_counters(nvml, read.handles(nvml)[0])
        u = read.read_usage(nvml, read.handles(nvml)[1])
    assert c == read.Counters(3, False, True, False, 6, 2)
    assert u == read.Usage(0, 0)


def test_discover_fake_gpus() -> None:
    inv = discover("node-a", fake=3, cpu_slots=16)
    assert (inv.kind, inv.slots, inv.gpus) == ("gpu", 3, fake_gpus(3, "node-a"))


def test_discover_fake_zero_gives_cpu_slots_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "load_nvml", lambda: pytest.fail("NVML must not be probed"))
    inv = discover("n", fake=0, cpu_slots=5)
    assert (inv.kind, inv.gpus, inv.slots) == ("cpu", (), 5)


@pytest.mark.parametrize(("cpu_count", "slots"), [(12, 12), (None, 1)])
def test_discover_cpu_slots_default_to_cpu_count(
    monkeypatch: pytest.MonkeyPatch, cpu_count: int | None, slots: int
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
    assert discover("n", fake=0).slots == slots


def test_discover_with_an_nvml_module() -> None:
    nvml: Any = fake.dgx_like(4)
    inv = discover("n", nvml=nvml)
    assert (inv.kind, inv.slots) == ("gpu", 4)
    assert inv.topology.worst((0, 1, 2, 3)) is Link.NVLINK


def test_discover_uses_pynvml_when_not_faked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", two())
    inv = discover("n", fake=None, cpu_slots=7)
    assert [g.uuid for g in inv.gpus] == ["GPU-aaaa", "GPU-bbbb"]


def test_discover_pynvml_with_zero_devices_gives_cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    assert discover("n", cpu_slots=7).slots == 7


@pytest.mark.parametrize("fail_on", ["nvmlInit", "nvmlDeviceGetName"])
def test_discover_nvml_failure_gives_cpu_slots(monkeypatch: pytest.MonkeyPatch, fail_on: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(two().gpus, fail_on=fail_on))
    inv = discover("n", cpu_slots=3)
    assert (inv.kind, inv.gpus, inv.slots) == ("cpu", (), 3)


def test_discover_without_pynvml_installed_gives_cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert discover("n", cpu_slots=2).kind == "cpu"


@pytest.mark.parametrize(("slots", "expected"), [((), ""), ((0,), "0"), ((1, 3), "1,3")])
def test_visible_devices_on_gpu_host(slots: tuple[int, ...], expected: str) -> None:
    assert Inventory(fake_gpus(4, "n"), 4).visible_devices(slots) == expected


def test_visible_devices_use_gpu_indices() -> None:
    inv = Inventory((Gpu(2, "GPU-2", "x", 1), Gpu(5, "GPU-5", "x", 1)), 2)
    assert inv.visible_devices((0, 1)) == "2,5"


def test_visible_devices_on_cpu_host_is_empty() -> None:
    assert Inventory((), 8).visible_devices((0, 1)) == ""


def test_to_json() -> None:
    assert Inventory((), 4).to_json() == {"kind": "cpu", "slots": 4, "gpus": []}
    gpu = Inventory((Gpu(0, "GPU-0", "T4", 15360),), 1).to_json()
    assert gpu["gpus"] == [
        {"index": 0, "uuid": "GPU-0", "name": "T4", "memory_mib": 15360, "bus_id": "", "cpus": (), "mig": ()}
    ]


def test_unknown_topology_is_system() -> None:
    assert Topology().worst((0, 1)) is Link.SYSTEM
    assert Topology().worst((3,)) is Link.NVLINK
