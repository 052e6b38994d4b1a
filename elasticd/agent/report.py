"""This node's report of its part in a job (``reports/<job>/<node>``, what ``status`` shows): its
state as shown, its devices, its workers' pids and progress, the straggler judge's verdicts
while our workers are their round's group rank 0, and where the job's time went here (goodput).

The report is built whenever it is asked for, also while the store cannot be reached (``status``
on this node shows it then). The executor publishes it under the lease for ``Publish``; while
the workers run, their progress is published on its own when due and changed (the pacing is
``conduct``'s), and the straggler judge reads the round's reports then.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, replace
from typing import Any

from elasticd.agent import conduct
from elasticd.agent.record import AgentRecord
from elasticd.agent.seams import Clock, Launcher, Workers
from elasticd.agent.stragglers import StragglerJudge
from elasticd.errors import EtcdUnavailable
from elasticd.jobs.attempt import NodeRuntime
from elasticd.progress.goodput import Tally, published, seconds
from elasticd.progress.slowness import report_scores
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.terms.spec import JobSpec


class Reporter:
    """This node's report in one job, and the round's straggler judge while we judge it."""

    def __init__(
        self,
        spec: JobSpec,
        rt: NodeRuntime,
        store: JobStore,
        slots: tuple[int, ...],
        launcher: Launcher,
        clock: Clock,
    ) -> None:
        self._spec = spec
        self._rt = rt
        self._store = store
        self._slots = slots
        self._launcher = launcher
        self._clock = clock
        self.sent = conduct.ProgressSent()  # when progress was last due, and what was sent
        self._stragglers: StragglerJudge | None = None  # while our workers run as group rank 0

    def judge(self, result: RoundHead, member: Member) -> None:
        """Our workers of ``result``'s round started as ``member``: as its group rank 0, judge it."""
        if member.group_rank == 0:
            self._stragglers = StragglerJudge(self._spec, result, self._rt.straggler_grace_s)

    def stop_judging(self) -> None:
        """Our workers stopped: so do the round's stragglers (``StragglerJudge.close``)."""
        if self._stragglers is not None:
            self._stragglers.close()
            self._stragglers = None

    def straggler_scores(self) -> dict[int, float]:
        """Every rank's slowness score in the round we judge (empty unless we are its group rank 0)."""
        return dict(self._stragglers.scores) if self._stragglers is not None else {}

    def goodput(self) -> tuple[Tally, Tally] | None:
        """Where the job's time went here: as of now, and the part no later event moves."""
        ledger = self._launcher.goodput()
        return None if ledger is None else (seconds(ledger, self._clock.time()), ledger.tally)

    def view(self, rec: AgentRecord, workers: Workers | None) -> dict[str, Any]:
        """The report, as this node knows it (``rec``: the agent's record; ``workers``: ours, if any)."""
        pids = workers.pids() if workers is not None else []
        exited = None
        if workers is not None and conduct.shows_exit(rec.state, True, len(pids)):
            exited = workers.observe(describe=False).outcome
        return {
            "state": conduct.shown_state(rec.state, exited),
            "round": rec.round,
            "devices": self._rt.inventory.visible_devices(self._slots),
            "pids": pids,
            "failure": rec.failure.to_json() if rec.failure else None,
            "updated_at": self._clock.time(),
            "progress": [p.to_json() for p in workers.progress()] if workers is not None else [],
            "stragglers": sorted(self._stragglers.flagged) if self._stragglers is not None else [],
            "scores": [asdict(s) for s in report_scores(self.straggler_scores())],
            **published(self._launcher.goodput(), self._clock.time()),
        }

    async def publish_progress(
        self, rec: AgentRecord, workers: Workers | None, running: bool, lease: int | None
    ) -> None:
        """While our workers run (``running``), publish their progress when due and changed, and
        let the straggler judge read the round's reports."""
        now = self._clock.time()
        if lease is None or not conduct.progress_due(self.sent, running, lease, now):
            return
        self.sent = replace(self.sent, at=now)  # the next check is due from now
        view = self.view(rec, workers)
        if conduct.progress_changed(self.sent, view["progress"]):
            with contextlib.suppress(EtcdUnavailable):
                await self._store.put_node_status(self._rt.node_id, view, lease)
                self.sent = replace(self.sent, progress=tuple(view["progress"]))
        if self._stragglers is not None:
            await self._stragglers.evaluate(self._store, now)
