"""elasticd.gpu.health: the verdicts on Xids and on counters against a baseline."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.gpu.health import (
    APPLICATION_XIDS,
    BASELINE,
    NVLINK_ERRORS_MAX,
    Verdict,
    judge,
    judge_xid,
)
from elasticd.gpu.read import Counters
from elasticd.terms.state import Fault


@pytest.mark.parametrize("code", sorted(APPLICATION_XIDS))
def test_application_xids_are_not_the_gpus_fault(code: int) -> None:
    assert judge_xid(code) is None


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119])
def test_hardware_xids_mark_it(code: int) -> None:
    assert judge_xid(code) == Verdict(Fault.XID, f"Xid {code}")


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        (replace(BASELINE, ecc_uncorrected=2), "uncorrectable ECC errors: 2 (was 0)"),
        (replace(BASELINE, remap_failed=True), "row remapping failed: the GPU needs replacing"),
        (replace(BASELINE, remap_pending=True), "row remapping pending: the GPU needs a reset"),
        (replace(BASELINE, retired_pending=True), "page retirement pending: the GPU needs a reset"),
        (replace(BASELINE, recovery_action=1), "driver asks for recovery: gpu_reset"),
        (replace(BASELINE, recovery_action=9), "driver asks for recovery: action 9"),
        (replace(BASELINE, nvlink_errors=NVLINK_ERRORS_MAX + 1), "NVLink errors: 101 (was 0)"),
    ],
)
def test_each_counter_from_a_fresh_baseline(now: Counters, reason: str) -> None:
    verdict = judge(BASELINE, now)
    assert verdict is not None and verdict.reason == reason


def test_nothing_wrong_or_unsupported_is_healthy() -> None:
    assert judge(BASELINE, BASELINE) is None
    assert judge(BASELINE, Counters()) is None
    assert judge(Counters(), Counters()) is None
    assert judge(BASELINE, replace(BASELINE, nvlink_errors=NVLINK_ERRORS_MAX)) is None


def test_an_accepted_state_counts_only_what_is_new() -> None:
    accepted = Counters(3, True, True, False, 50, 1)
    assert judge(accepted, accepted) is None
    assert judge(accepted, replace(accepted, ecc_uncorrected=4)) == Verdict(
        Fault.ECC, "uncorrectable ECC errors: 4 (was 3)"
    )
    assert judge(accepted, replace(accepted, remap_failed=True)) is not None
    assert judge(accepted, replace(accepted, recovery_action=2)) == Verdict(
        Fault.RECOVERY_ACTION, "driver asks for recovery: node_reboot"
    )


def test_a_driver_reload_resets_counts_without_a_verdict() -> None:
    assert (
        judge(Counters(ecc_uncorrected=5, nvlink_errors=500), Counters(ecc_uncorrected=0, nvlink_errors=0))
        is None
    )


counters = st.builds(
    Counters,
    st.none() | st.integers(0, 1000),
    st.none() | st.booleans(),
    st.none() | st.booleans(),
    st.none() | st.booleans(),
    st.none() | st.integers(0, 10_000),
    st.none() | st.integers(0, 7),
)


@given(counters)
def test_a_reading_judged_against_itself_is_healthy(c: Counters) -> None:
    assert judge(c, c) is None


@given(counters, counters)
def test_a_verdict_names_a_reading_that_moved(base: Counters, now: Counters) -> None:
    if judge(base, now) is not None:
        assert base != now


def test_nvml_errors_that_mean_the_gpu_is_gone() -> None:
    from elasticd.gpu.health import judge_error

    assert judge_error(15) == Verdict(Fault.LOST, "the GPU is lost (fallen off the bus)")
    assert judge_error(16) is not None
    assert judge_error(3) is None and judge_error(None) is None
