"""The GPU health watcher: a thread that waits on NVML's Xid events and polls the counters.

It only reads and judges (``elasticd.gpu.health``); what a verdict does (the GPU out of the
pool, the job holding it restarted without it) is ``manager/gpus.py``'s, on the event loop,
reached through ``report``. Each wait is bounded (``WAIT_S``), so a stop is prompt; the
counters are read every ``poll_s``. One verdict per GPU until the operator returns it
(``accept``), which also takes the counters as they are then as its new baseline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from elasticd import log
from elasticd.gpu import health
from elasticd.gpu.health import Verdict
from elasticd.gpu.nvml import ERROR_TIMEOUT, EVENT_XID_CRITICAL, Nvml, code_of, text
from elasticd.gpu.read import Counters, Usage, handles, read_counters, read_usage, session

_log = log.get("elasticd.gpu")

POLL_S = 10.0
WAIT_S = 1.0
STOP_S = 5.0


class GpuWatch:
    def __init__(
        self,
        nvml: Nvml,
        report: Callable[[str, Verdict], None],
        poll_s: float = POLL_S,
        wait_s: float = WAIT_S,
    ) -> None:
        self._nvml = nvml
        self._report = report
        self._poll_s = poll_s
        self._wait_s = min(wait_s, poll_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._accepted: set[str] = set()
        self._usage: dict[str, Usage] = {}
        self._thread = threading.Thread(target=self._run, name="gpu-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_S)

    def accept(self, uuid: str) -> None:
        """The operator returned the GPU: judge it from its counters as they are now."""
        with self._lock:
            self._accepted.add(uuid)

    def usage(self) -> dict[str, Usage]:
        """Each GPU's memory used and utilisation at the last poll."""
        with self._lock:
            return dict(self._usage)

    def _run(self) -> None:
        try:
            with session(self._nvml):
                self._watch()
        except Exception as exc:  # NVML gone from under us: say so, the daemon goes on without
            _log.error("gpu.watch_failed", error=str(exc))

    def _watch(self) -> None:
        nvml = self._nvml
        by_uuid = {text(nvml.nvmlDeviceGetUUID(h)): h for h in handles(nvml)}
        baselines = dict.fromkeys(by_uuid, health.BASELINE)
        reported: set[str] = set()
        events = _events(nvml, list(by_uuid.values()))
        try:
            next_poll = 0.0
            while not self._stop.is_set():
                with self._lock:
                    accepted, self._accepted = self._accepted, set()
                for uuid in accepted & set(by_uuid):
                    baselines[uuid] = read_counters(nvml, by_uuid[uuid])
                    reported.discard(uuid)
                if time.monotonic() >= next_poll:
                    for uuid, handle in by_uuid.items():
                        if uuid not in reported:
                            self._verdict(uuid, _judge(nvml, handle, baselines[uuid]), reported)
                    usage = {uuid: read_usage(nvml, handle) for uuid, handle in by_uuid.items()}
                    with self._lock:
                        self._usage = usage
                    next_poll = time.monotonic() + self._poll_s
                if events is None:
                    self._stop.wait(self._wait_s)
                    continue
                try:
                    xid = _wait(nvml, events, self._wait_s)
                except nvml.NVMLError as exc:  # events do not work here: the poll goes on alone
                    _log.warning("gpu.events_off", error=str(exc))
                    nvml.nvmlEventSetFree(events)
                    events = None
                    continue
                if xid is not None and xid[0] not in reported:
                    self._verdict(xid[0], health.judge_xid(xid[1]), reported)
        finally:
            if events is not None:
                nvml.nvmlEventSetFree(events)

    def _verdict(self, uuid: str, verdict: Verdict | None, reported: set[str]) -> None:
        if verdict is None:
            return
        reported.add(uuid)
        _log.warning("gpu.unhealthy_seen", uuid=uuid, fault=verdict.fault.value, reason=verdict.reason)
        self._report(uuid, verdict)


def _judge(nvml: Nvml, handle: Any, baseline: Counters) -> Verdict | None:
    try:
        nvml.nvmlDeviceGetMemoryInfo(handle)  # a lost GPU fails every call: this one says how
    except nvml.NVMLError as exc:
        return health.judge_error(code_of(exc))
    return health.judge(baseline, read_counters(nvml, handle))


def _events(nvml: Nvml, hs: list[Any]) -> Any:
    """An event set with every GPU that reports Xid events registered; None if none does."""
    try:
        events = nvml.nvmlEventSetCreate()
    except nvml.NVMLError:
        return None
    registered = 0
    for handle in hs:
        try:
            nvml.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, events)
            registered += 1
        except nvml.NVMLError as exc:  # NOT_SUPPORTED on some boards: the poll still judges it
            _log.info("gpu.no_events", error=str(exc))
    if not registered:
        nvml.nvmlEventSetFree(events)
        return None
    return events


def _wait(nvml: Nvml, events: Any, wait_s: float) -> tuple[str, int] | None:
    """The next Xid (the GPU's UUID and the code), or None after ``wait_s``; an NVML error other
    than the timeout is raised."""
    try:
        data = nvml.nvmlEventSetWait_v2(events, int(wait_s * 1000))
    except nvml.NVMLError as exc:
        if code_of(exc) != ERROR_TIMEOUT:
            raise
        return None
    if not int(data.eventType) & EVENT_XID_CRITICAL:
        return None
    return text(nvml.nvmlDeviceGetUUID(data.device)), int(data.eventData)
