"""elasticd.node.gpuwatch: Xid events and counters on the fake NVML become one verdict per GPU."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

from elasticd.gpu import fake
from elasticd.gpu.fake import FakeNvml
from elasticd.gpu.health import Verdict
from elasticd.node.gpuwatch import GpuWatch
from elasticd.terms.state import Fault

WAIT_S = 5.0


@pytest.fixture
def nvml() -> FakeNvml:
    return fake.dgx_like(2)


@pytest.fixture
def seen(nvml: FakeNvml) -> Iterator[queue.Queue[tuple[str, Verdict]]]:
    q: queue.Queue[tuple[str, Verdict]] = queue.Queue()
    lib: Any = nvml
    watch = GpuWatch(lib, lambda uuid, v: q.put((uuid, v)), poll_s=0.02, wait_s=0.01)
    nvml.watch = watch  # type: ignore[attr-defined]
    watch.start()
    yield q
    watch.close()
    assert nvml.initialised == 0  # the session ended with the thread


def test_an_xid_marks_its_gpu_once(nvml: FakeNvml, seen: queue.Queue[tuple[str, Verdict]]) -> None:
    nvml.xid(1, 13)  # the application's: nothing
    nvml.xid(1, 79)
    nvml.xid(1, 48)  # already reported: not again
    assert seen.get(timeout=WAIT_S) == ("GPU-fake-1", Verdict(Fault.XID, "Xid 79"))
    nvml.gpus[0].ecc_uncorrected = 1
    uuid, verdict = seen.get(timeout=WAIT_S)
    assert (uuid, verdict.fault) == ("GPU-fake-0", Fault.ECC)
    assert seen.empty()


def test_accept_takes_the_counters_as_they_are(
    nvml: FakeNvml, seen: queue.Queue[tuple[str, Verdict]]
) -> None:
    nvml.gpus[0].remap_pending = True
    assert seen.get(timeout=WAIT_S)[1].fault is Fault.ROW_REMAP
    nvml.watch.accept("GPU-fake-0")  # type: ignore[attr-defined]
    reads = nvml.counts["nvmlDeviceGetTotalEccErrors"]
    deadline = time.monotonic() + WAIT_S
    while nvml.counts["nvmlDeviceGetTotalEccErrors"] < reads + 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # the baseline taken, and polls after it found nothing
    assert seen.empty()
    nvml.gpus[0].ecc_uncorrected = 2  # new since the operator returned it
    uuid, verdict = seen.get(timeout=WAIT_S)
    assert (uuid, verdict.fault) == ("GPU-fake-0", Fault.ECC)


def test_a_lost_gpu(nvml: FakeNvml, seen: queue.Queue[tuple[str, Verdict]]) -> None:
    original = nvml.nvmlDeviceGetMemoryInfo

    def lost(handle: Any) -> Any:
        if handle.index == 1:
            raise fake.FakeNvmlError(15)
        return original(handle)

    nvml.nvmlDeviceGetMemoryInfo = lost  # type: ignore[method-assign]
    assert seen.get(timeout=WAIT_S) == (
        "GPU-fake-1",
        Verdict(Fault.LOST, "the GPU is lost (fallen off the bus)"),
    )


def test_without_events_the_poll_still_judges() -> None:
    nvml = fake.pcie_only(1)
    nvml.gpus[0].unsupported.add("nvmlDeviceRegisterEvents")
    nvml.gpus[0].retired_pending = True
    q: queue.Queue[tuple[str, Verdict]] = queue.Queue()
    lib: Any = nvml
    watch = GpuWatch(lib, lambda uuid, v: q.put((uuid, v)), poll_s=0.02, wait_s=0.01)
    watch.start()
    try:
        assert q.get(timeout=WAIT_S)[1].fault is Fault.PAGE_RETIREMENT
    finally:
        watch.close()


def test_a_broken_event_wait_leaves_the_poll_alone() -> None:
    nvml = fake.pcie_only(1)

    tries: list[int] = []

    def broken(event_set: object, timeout_ms: int) -> Any:
        tries.append(timeout_ms)
        raise fake.FakeNvmlError(13)  # FUNCTION_NOT_FOUND: an old driver without the _v2 wait

    nvml.nvmlEventSetWait_v2 = broken  # type: ignore[method-assign]
    q: queue.Queue[tuple[str, Verdict]] = queue.Queue()
    lib: Any = nvml
    watch = GpuWatch(lib, lambda uuid, v: q.put((uuid, v)), poll_s=0.02, wait_s=0.01)
    watch.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while nvml.counts["nvmlEventSetFree"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert nvml.counts["nvmlEventSetFree"] == 1  # given up at once, while the watch runs
        nvml.gpus[0].ecc_uncorrected = 1
        assert q.get(timeout=WAIT_S)[1].fault is Fault.ECC
        assert len(tries) == 1  # and never tried again
    finally:
        watch.close()
