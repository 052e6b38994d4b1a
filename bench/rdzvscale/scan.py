"""Another daemon's scan of every job beside the round: what a round costs every daemon."""

from __future__ import annotations

import asyncio
import threading
import time

from elasticd.etcd.keys import Keys
from elasticd.etcd.types import Query
from elasticd.manager.jobsread import JobsRead
from rdzvscale.meter import Meter, MeteredClient, Tally

_METER: list[Meter] = []  # the bench's own process: its probes' one ``Meter``


def scan_meter() -> Meter:
    """This process's ``Meter``, made at the first round (it patches the client once)."""
    _METER[:] = _METER or [Meter()]
    return _METER[0]


class ScanProbe:
    """One daemon's scan of every job beside the round, on the real ``JobsRead`` (what the scan
    and the table of ``status`` read through): it reads the job before the round starts, then once
    more as soon as the round's head exists (before the participants leave), and counts that read's
    response bytes; then, apart, the bytes of ``rounds/`` (every member's assignment: what the
    scan's read carried too when it covered that range)."""

    def __init__(self, endpoint: str, keys: Keys, job_id: str, meter: Meter) -> None:
        self._client = MeteredClient([endpoint], timeout_s=60)
        self._client.meter = meter
        self._keys, self._job = keys, job_id
        self._reader = JobsRead(self._client, keys)
        asyncio.run(self._reader.read())
        self.read_bytes = self.rounds_bytes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout_s: float) -> None:
        self._deadline = time.monotonic() + timeout_s
        self._thread.start()

    def stop(self) -> None:
        self._deadline = 0.0
        if self._thread.ident is not None:  # (started)
            self._thread.join(10)
        self._client.close()

    def _run(self) -> None:
        while self._client.get(self._keys.result(self._job, 0)) is None:
            if time.monotonic() > self._deadline:
                return
            time.sleep(0.02)
        tally = self._client.tally = Tally()
        asyncio.run(self._reader.read())
        self.read_bytes, tally.read_bytes = tally.read_bytes, 0
        self._client.read_many([Query(self._keys.job_rounds(self._job), prefix=True)])
        self.rounds_bytes = tally.read_bytes
        self._client.tally = None
