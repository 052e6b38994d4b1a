"""Job-wide straggler verdicts, made by one node per round: the member of group rank 0.

Every member publishes its ranks' evidence with their progress (``progress.threadstate``, in the
node's report). The judging node reads the round's reports when its own progress is due, scores
every rank against the fastest (``progress.slowness.scores``), and keeps the verdicts with
hysteresis (``slowness.judge``); a change is a record on the bus (an event in the history, a
metric). Reports are untrusted input: each was decoded by ``NodeStatus`` (bounded numbers, at most
``MAX_NPROC_PER_NODE`` ranks), one of another round says nothing, and a read that fails costs one
evaluation, never the job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from elasticd import log
from elasticd.errors import EtcdUnavailable
from elasticd.happenings.bus import publish
from elasticd.happenings.records import StragglerCleared, StragglerFound
from elasticd.progress.slowness import Change, Evidence, Verdicts, ended, judge, scores
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import NodeStatus

_log = log.get("elasticd.agent")


def round_evidence(statuses: Mapping[str, NodeStatus], round_no: int) -> dict[int, Evidence]:
    """Each rank's evidence in ``round_no``, from the members' reports of that round."""
    out: dict[int, Evidence] = {}
    for status in statuses.values():
        if status.round != round_no:
            continue
        for p in status.progress:
            if (seen := p.evidence) is not None:
                out[p.rank] = seen
    return out


class StragglerJudge:
    """The verdicts of one round, on the node that judges it."""

    def __init__(self, job: str, round_no: int) -> None:
        self.job = job
        self.round = round_no
        self._verdicts = Verdicts()
        self.scores: dict[int, float] = {}

    async def evaluate(self, store: JobStore, now: float) -> None:
        """Read the round's reports, score every rank and say what changed."""
        with contextlib.suppress(EtcdUnavailable):
            statuses = await store.statuses()
            self.scores = scores(round_evidence(statuses, self.round))
            self._verdicts, changes = judge(self._verdicts, self.scores, now)
            self._tell(changes)

    @property
    def flagged(self) -> frozenset[int]:
        """The ranks that are stragglers now (published in this node's report for ``status``)."""
        return self._verdicts.flagged

    def close(self) -> None:
        """The round's workers stopped: every straggler of it stops being one."""
        self._tell(ended(self._verdicts))
        self._verdicts = Verdicts()

    def _tell(self, changes: tuple[Change, ...]) -> None:
        for c in changes:
            if c.straggler and c.score is not None:
                publish(StragglerFound(self.job, self.round, c.rank, c.score))
            else:
                publish(StragglerCleared(self.job, self.round, c.rank, c.score))
