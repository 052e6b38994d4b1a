"""elasticd.manager.gpus.GpuPool over MemoryKV: marks written and read, slots out, states shown."""

from __future__ import annotations

import asyncio
from typing import Any

from elasticd.errors import EtcdUnavailable
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.gpu import fake, read
from elasticd.gpu.health import Verdict
from elasticd.gpu.read import Usage
from elasticd.node.allocator import Allocator
from elasticd.node.inventory import inventory_of
from elasticd.terms.state import Fault

KEYS = Keys("/t")
BAD = Verdict(Fault.XID, "Xid 79")


def pool(kv: Any, accepted: list[str] | None = None) -> tuple[Any, Allocator]:
    from elasticd.manager.gpus import GpuPool

    nvml: Any = fake.pcie_only(3, "n")
    nvml.gpus[2].mig = [fake.FakeMig("MIG-n-2a"), fake.FakeMig("MIG-n-2b")]
    inv = inventory_of(*read.read_gpus(nvml))
    alloc = Allocator(inv.slots)
    usage = {"GPU-n-0": Usage(1000, 42)}
    acc = accepted if accepted is not None else []
    return GpuPool(kv, KEYS, "n", inv, alloc, accept=acc.append, usage=lambda: usage), alloc


def test_a_report_takes_every_slot_of_the_gpu_out_and_is_written() -> None:
    kv = MemoryKV()
    p, alloc = pool(kv)
    assert alloc.allocate("j", 1) == (0,)
    asyncio.run(p.report("GPU-n-2", BAD, None, 5.0))
    assert alloc.out == {2, 3}  # both MIG slices of the partitioned GPU
    assert alloc.free() == [1]
    stored = kv.get(KEYS.gpu("n", "GPU-n-2"))
    assert stored is not None and b"Xid 79" in stored.value


def test_a_deleted_mark_returns_the_gpu_and_asks_for_a_fresh_judgement() -> None:
    kv = MemoryKV()
    accepted: list[str] = []
    p, alloc = pool(kv, accepted)
    asyncio.run(p.report("GPU-n-1", BAD, "j", 5.0))
    asyncio.run(p.sync())
    assert alloc.out == {1} and accepted == []
    kv.delete(KEYS.gpu("n", "GPU-n-1"))
    asyncio.run(p.sync())
    assert alloc.out == frozenset() and accepted == ["GPU-n-1"]


def test_marks_survive_a_restart_and_bad_ones_keep_the_gpu_out() -> None:
    kv = MemoryKV()
    p, _ = pool(kv)
    asyncio.run(p.report("GPU-n-0", BAD, None, 5.0))
    kv.put_json(KEYS.gpu("n", "GPU-n-1"), ["not", "a", "mark"])
    again, alloc = pool(kv)  # a restarted daemon
    asyncio.run(again.sync())
    assert alloc.out == {0, 1}
    assert again.marks["GPU-n-1"].reason == "invalid mark record"


def test_a_mark_etcd_refused_is_written_at_the_next_sync() -> None:
    kv = MemoryKV()
    p, alloc = pool(kv)
    real_put = kv.put_json

    def down(*args: Any, **kw: Any) -> None:
        raise EtcdUnavailable("down")

    kv.put_json = down  # type: ignore[method-assign]
    asyncio.run(p.report("GPU-n-0", BAD, None, 5.0))
    assert alloc.out == {0} and kv.get(KEYS.gpu("n", "GPU-n-0")) is None
    kv.put_json = real_put  # type: ignore[method-assign]
    asyncio.run(p.sync())
    assert alloc.out == {0} and kv.get(KEYS.gpu("n", "GPU-n-0")) is not None


def test_states() -> None:
    p, alloc = pool(MemoryKV())
    alloc.allocate("j", 2)
    asyncio.run(p.report("GPU-n-1", BAD, "j", 5.0))
    states = p.states({"j": 4})
    assert [s["state"] for s in states] == ["healthy", "unhealthy", "healthy"]
    assert (states[0]["job"], states[0]["rank"], states[1]["rank"]) == ("j", 4, 5)
    assert (states[0]["memory_used_mib"], states[0]["utilization_pct"]) == (768, 40)  # coarse steps
    assert p.states({"j": 4}, coarse=False)[0]["memory_used_mib"] == 1000
    assert states[1]["reason"] == "Xid 79" and states[2]["job"] is None
    assert p.states()[0]["rank"] is None  # workers not started


def test_marks_of_gpus_this_node_lacks_are_ignored() -> None:
    kv = MemoryKV()
    kv.put_json(KEYS.gpu("n", "GPU-elsewhere"), {"fault": "xid", "reason": "Xid 79"})
    p, alloc = pool(kv)
    asyncio.run(p.sync())
    assert p.marks == {} and alloc.out == frozenset()


def test_a_node_record_counts_the_slots_of_each_kind() -> None:
    from elasticd.gpu.devices import Gpu, MigSlice
    from elasticd.node.registry import InventoryRecord, NodeRecord

    mig = (MigSlice("MIG-a", "1g", 10), MigSlice("MIG-b", "1g", 10))
    gpus = (Gpu(0, "GPU-0", "H100", 80), Gpu(1, "GPU-1", "H100", 80, mig=mig))
    record = NodeRecord("n1", 3, inventory=InventoryRecord("gpu", 3, gpus))
    assert (record.slots_for(False), record.slots_for(True)) == (1, 2)
    cpu = NodeRecord("n2", 8)
    assert (cpu.slots_for(False), cpu.slots_for(True)) == (8, 0)
