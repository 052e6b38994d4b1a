"""Which NVML readings make a GPU unhealthy, and why. Pure: readings in, a reason (or None) out.

Counters are judged against a baseline: the reading when the GPU last entered the pool (zero at
the daemon's start; the reading at the operator's ``undrain --gpu``, who accepted the GPU as it
was then). Only what changed since counts, so a GPU an operator returned is not thrown out again
for the same error, and a new one takes it out at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.gpu.nvml import ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, RECOVERY_ACTIONS
from elasticd.gpu.read import Counters
from elasticd.terms.state import Fault

# Xids an application causes (an illegal address, a kernel exception, a reset channel, a
# timeout it asked for, a bad graphics context...): they say nothing about the GPU, as in the
# NVIDIA Kubernetes device plugin's list of Xids it ignores. Every other critical Xid
# (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92-95 ECC,
# 119/120 GSP, ...) marks the GPU unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# NVLink replay, recovery and CRC errors a GPU may gather (a retrained link) before it is out.
NVLINK_ERRORS_MAX = 100


@dataclass(frozen=True)
class Verdict:
    fault: Fault
    reason: str  # one line, for the node record, ``nodes`` and the event


BASELINE = Counters(0, False, False, False, 0, 0)  # a GPU first seen: every error counts


def judge_xid(code: int) -> Verdict | None:
    """An Xid critical-error event's verdict, or None for one the application caused."""
    if code in APPLICATION_XIDS:
        return None
    return Verdict(Fault.XID, f"Xid {code}")


def judge_error(code: int | None) -> Verdict | None:
    """The verdict on an NVML error a plain read of the GPU met (None: not the GPU's state)."""
    if code == ERROR_GPU_IS_LOST:
        return Verdict(Fault.LOST, "the GPU is lost (fallen off the bus)")
    if code == ERROR_RESET_REQUIRED:
        return Verdict(Fault.LOST, "the GPU needs a reset")
    return None


def judge(baseline: Counters, now: Counters) -> Verdict | None:
    """Why the GPU is unhealthy by its counters (the first reason that applies), or None.

    A counter the GPU does not have (None) says nothing; nor does one that went down (the driver
    reloaded, which resets the volatile counts)."""
    if _rose(baseline.ecc_uncorrected, now.ecc_uncorrected, 0):
        return Verdict(
            Fault.ECC,
            f"uncorrectable ECC errors: {now.ecc_uncorrected} (was {baseline.ecc_uncorrected or 0})",
        )
    if now.remap_failed and not baseline.remap_failed:
        return Verdict(Fault.ROW_REMAP, "row remapping failed: the GPU needs replacing")
    if now.remap_pending and not baseline.remap_pending:
        return Verdict(Fault.ROW_REMAP, "row remapping pending: the GPU needs a reset")
    if now.retired_pending and not baseline.retired_pending:
        return Verdict(Fault.PAGE_RETIREMENT, "page retirement pending: the GPU needs a reset")
    action = now.recovery_action
    if action and action != baseline.recovery_action:
        return Verdict(
            Fault.RECOVERY_ACTION,
            f"driver asks for recovery: {RECOVERY_ACTIONS.get(action, f'action {action}')}",
        )
    if _rose(baseline.nvlink_errors, now.nvlink_errors, NVLINK_ERRORS_MAX):
        return Verdict(
            Fault.NVLINK, f"NVLink errors: {now.nvlink_errors} (was {baseline.nvlink_errors or 0})"
        )
    return None


def _rose(before: int | None, after: int | None, allowed: int) -> bool:
    return after is not None and after - (before or 0) > allowed
