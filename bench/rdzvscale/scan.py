"""Another daemon's copy of every job beside the round: what a round costs every daemon."""

from __future__ import annotations

import asyncio
import threading
import time

from elasticd.etcd.keys import Keys
from elasticd.etcd.types import Query
from elasticd.informer.informer import Phase
from elasticd.manager.clustercopy import ClusterCopy
from rdzvscale.meter import Meter, MeteredClient, Tally

_METER: list[Meter] = []  # the bench's own process: its probes' one ``Meter``


def scan_meter() -> Meter:
    """This process's ``Meter``, made at the first round (it patches the client once)."""
    _METER[:] = _METER or [Meter()]
    return _METER[0]


class ScanProbe:
    """One daemon's copy of every job beside the round, on the real ``ClusterCopy`` (what the
    scan and the table of ``status`` read): listed before the round starts and kept by its
    watch, it counts what reaches it from the round's start until it holds the round's head
    (before the participants leave): the bytes its reads returned (``read_bytes``: none while
    its watch holds) and its watch's lines (``watch_bytes``); then, apart, the bytes of
    ``rounds/`` (every member's assignment: what the copy would carry if it held that range)."""

    def __init__(self, endpoint: str, keys: Keys, job_id: str, meter: Meter) -> None:
        self._client = MeteredClient([endpoint], timeout_s=60)
        self._client.meter = meter
        self._keys, self._job = keys, job_id
        self._tally = self._client.tally = Tally()
        self._copy = ClusterCopy(self._client, keys, "scan-probe", wake=lambda change: None)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        meter.watching(self._tally, self._open)  # its watch lines are counted to the tally
        self.read_bytes = self.watch_bytes = self.rounds_bytes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        """Run the copy on its own loop until its watch is open."""
        self._loop_thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._copy.run(), self._loop)
        deadline = time.monotonic() + 30
        while self._copy.informer.phase is not Phase.WATCHING and time.monotonic() < deadline:
            time.sleep(0.01)

    def start(self, timeout_s: float) -> None:
        self._deadline = time.monotonic() + timeout_s
        self._tally.read_bytes = self._tally.watch_bytes = 0
        self._thread.start()

    def stop(self) -> None:
        self._deadline = 0.0
        if self._thread.ident is not None:  # (started)
            self._thread.join(10)
        self._task.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(10)
        self._client.close()

    def _run(self) -> None:
        head = self._keys.result(self._job, 0)
        while self._copy.informer.store.get(head) is None:  # (the copy holds it: its watch's news)
            if time.monotonic() > self._deadline:
                return
            time.sleep(0.02)
        tally = self._tally
        self.watch_bytes = tally.watch_bytes
        self.read_bytes, tally.read_bytes = tally.read_bytes - tally.watch_bytes, 0
        self._client.read_many([Query(self._keys.job_rounds(self._job), prefix=True)])
        self.rounds_bytes = tally.read_bytes
        self._client.tally = None
