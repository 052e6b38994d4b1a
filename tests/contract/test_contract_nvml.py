"""The NVML seam's contract: the readers give the same shape of answer on ``FakeNvml`` and on the
real ``pynvml``. The real half runs only where NVML finds a GPU, and skips saying why otherwise;
CI never depends on a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from elasticd.gpu import fake, read
from elasticd.gpu import nvml as api
from elasticd.gpu.nvml import Nvml
from elasticd.gpu.topology import Link


def _real() -> Nvml:
    try:
        import pynvml
    except ImportError:
        pytest.skip("pynvml (nvidia-ml-py) is not installed")
    nvml = cast(Nvml, pynvml)
    try:
        nvml.nvmlInit()
    except Exception as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        count = nvml.nvmlDeviceGetCount()
    finally:
        nvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML found no GPU")
    return nvml


@pytest.fixture(params=["fake", "pynvml"])
def nvml(request: pytest.FixtureRequest) -> Iterator[Nvml]:
    if request.param == "fake":
        yield cast(Nvml, fake.dgx_like(2))
    else:
        yield _real()


def test_inventory_reads(nvml: Nvml) -> None:
    gpus, topology = read.read_gpus(nvml)
    assert gpus
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    for g in gpus:
        assert g.uuid.startswith("GPU-")
        assert g.memory_mib > 0 and g.name
        assert all(isinstance(c, int) and c >= 0 for c in g.cpus)
        assert all(s.uuid.startswith("MIG-") for s in g.mig)
    assert len(topology.links) == len(gpus)
    assert all(topology.link(i, i) is Link.NVLINK for i in range(len(gpus)))
    assert all(topology.link(i, j) == topology.link(j, i) for i in range(len(gpus)) for j in range(len(gpus)))


def test_counters_and_usage_read(nvml: Nvml) -> None:
    with read.session(nvml):
        for handle in read.handles(nvml):
            c = read.read_counters(nvml, handle)
            assert c.ecc_uncorrected is None or c.ecc_uncorrected >= 0
            assert c.nvlink_errors is None or c.nvlink_errors >= 0
            assert c.recovery_action is None or c.recovery_action >= 0
            for flag in (c.retired_pending, c.remap_pending, c.remap_failed):
                assert flag is None or isinstance(flag, bool)
            u = read.read_usage(nvml, handle)
            assert u.memory_used_mib is None or u.memory_used_mib >= 0
            assert u.utilization_pct is None or 0 <= u.utilization_pct <= 100


def test_event_wait_times_out_when_quiet(nvml: Nvml) -> None:
    with read.session(nvml):
        events = nvml.nvmlEventSetCreate()
        try:
            for handle in read.handles(nvml):
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, api.EVENT_XID_CRITICAL, events)
                except nvml.NVMLError:
                    pytest.skip("this GPU does not report Xid events")
            with pytest.raises(nvml.NVMLError) as err:
                nvml.nvmlEventSetWait_v2(events, 10)
            assert api.code_of(err.value) == api.ERROR_TIMEOUT
        finally:
            nvml.nvmlEventSetFree(events)


def test_a_call_before_init_fails_with_an_nvml_error(nvml: Nvml) -> None:
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceGetCount()


def test_unsupported_reads_as_none() -> None:
    f = fake.pcie_only(1)
    f.gpus[0].unsupported |= {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"}
    f.gpus[0].recovery_action = None
    nvml: Any = f
    with read.session(nvml):
        c = read.read_counters(nvml, read.handles(nvml)[0])
    assert (c.ecc_uncorrected, c.remap_pending, c.remap_failed, c.recovery_action) == (None, None, None, None)
    assert c.nvlink_errors is None  # a PCIe card has no active link
    assert c.retired_pending is False
