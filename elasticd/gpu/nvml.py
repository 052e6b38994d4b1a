"""The part of NVML that elasticd uses, as a protocol: ``pynvml`` (nvidia-ml-py) or ``FakeNvml``.

The seam is NVML's own function API rather than a wrapper of ours, so that the readers in
``read.py`` run unchanged on the real library (``tests/contract/test_contract_nvml.py``) and on
the fake, and a real GPU can be made to look unhealthy by overriding one call
(``bench/gpu_check.sh``). The constants are NVML's ABI values, copied so that the readers need no
NVML module to name them.
"""

from __future__ import annotations

from typing import Any, Protocol

# nvmlEventType*: the only event the watcher registers for.
EVENT_XID_CRITICAL = 0x8
# nvmlMemoryErrorType_t / nvmlEccCounterType_t
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
# nvmlEnableState_t
FEATURE_ENABLED = 1
# nvmlReturn_t values the readers tell apart
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
# nvmlNvLinkErrorCounter_t
NVLINK_ERROR_DL_REPLAY = 0
NVLINK_ERROR_DL_RECOVERY = 1
NVLINK_ERROR_DL_CRC_FLIT = 2
NVLINK_ERROR_DL_CRC_DATA = 3
NVLINK_MAX_LINKS = 18  # NVML's bound is 36; no shipping GPU has more than 18 (H100)
# nvmlGpuTopologyLevel_t
TOPOLOGY_INTERNAL = 0
TOPOLOGY_SINGLE = 10
TOPOLOGY_MULTIPLE = 20
TOPOLOGY_HOSTBRIDGE = 30
TOPOLOGY_NODE = 40
TOPOLOGY_SYSTEM = 50
# nvmlGpuP2PCapsIndex_t / nvmlGpuP2PStatus_t
P2P_CAPS_INDEX_NVLINK = 2
P2P_STATUS_OK = 0
# field ids
FI_DEV_GET_GPU_RECOVERY_ACTION = 230
# nvmlDeviceGpuRecoveryAction_t (NONE = 0)
RECOVERY_ACTIONS = {1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}
MIG_ENABLED = 1


class Nvml(Protocol):
    """The calls of pynvml that elasticd makes. Errors are raised as ``NVMLError`` (with ``value``,
    an ``nvmlReturn_t``); handles are opaque."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .total, .used
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...  # .busId
    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpu_set_size: int) -> Any: ...  # 64-bit words
    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int: ...
    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> Any: ...  # (current, pending)
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(
        self, event_set: Any, timeout_ms: int
    ) -> Any: ...  # .device .eventType .eventData
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


def code_of(exc: BaseException) -> int | None:
    """The ``nvmlReturn_t`` of an NVML error (None for any other exception)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def text(value: object) -> str:
    """Older pynvml returns bytes where newer returns str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
