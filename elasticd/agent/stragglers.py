"""Job-wide straggler verdicts, made by one node per round: the member of group rank 0.

Every member publishes its ranks' evidence with their progress (``progress.threadstate``, in the
node's report). The judging node reads the round's reports when its own progress is due, scores
every rank against the fastest (``progress.slowness.scores``) over windows that end at the same
moment on every node (``slowness.aligned``: the last few of each rank are kept to find one), and
keeps the verdicts with hysteresis (``slowness.judge``); a change is a record on the bus (an
event in the history, a metric). Under ``--stragglers drain``, a node that held a straggler for the daemon's
``straggler_grace`` is drained out of this job (``slowness.drains``: never below the job's
minimum) by the same record an operator's ``drain NODE --job JOB`` writes, so it leaves by the
graceful drain that loses no step; ``undrain NODE --job JOB`` lets it take part again.

Reports are untrusted input: each was decoded by ``NodeStatus`` (bounded numbers, at most
``MAX_NPROC_PER_NODE`` ranks), one of another round says nothing, and a read that fails costs one
evaluation, never the job. The evidence in them is the daemons' own looks at the ranks, not what a
worker says of itself, and a drain names one node and this job only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping

from elasticd import log
from elasticd.errors import EtcdUnavailable
from elasticd.happenings.bus import publish
from elasticd.happenings.records import NodeDrained, StragglerCleared, StragglerFound
from elasticd.progress.slowness import (
    Change,
    Drain,
    Evidence,
    Keep,
    Verdicts,
    aligned,
    drains,
    ended,
    judge,
    scores,
)
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import DrainRecord, NodeStatus, RoundHead
from elasticd.terms.options import StragglerPolicy
from elasticd.terms.spec import JobSpec

DRAINED_BY = "elasticd (stragglers)"  # who a straggler's drain says asked for it
EVALUATE_S = 5.0  # a round's reports are read this often at most ...
READS_PER_S = 200.0  # ... and never more than this many reports a second, whatever the round's size
KEEP_WINDOWS = 3  # each rank's windows kept to find one that every rank has (nodes publish out of phase)


def evaluate_every(size: int) -> float:
    """Seconds between two reads of a round of ``size`` nodes' reports: every progress period for a
    small round, less often for a large one, so that the judge's reads stay O(1) a second however
    many nodes report (1,024 nodes: every 5.1 s; 12,500: every 62.5 s)."""
    return max(EVALUATE_S, size / READS_PER_S)


_log = log.get("elasticd.agent")


def round_evidence(
    statuses: Mapping[str, NodeStatus], round_no: int
) -> dict[int, tuple[float | None, Evidence]]:
    """Each rank's evidence in ``round_no`` and when its window ends, from the members' reports of
    that round."""
    out: dict[int, tuple[float | None, Evidence]] = {}
    for status in statuses.values():
        if status.round != round_no:
            continue
        for p in status.progress:
            if (seen := p.evidence) is not None:
                out[p.rank] = (p.evidence_at, seen)
    return out


def remember(
    seen: Mapping[int, Mapping[float | None, Evidence]], now: Mapping[int, tuple[float | None, Evidence]]
) -> dict[int, dict[float | None, Evidence]]:
    """The windows to compare from: each rank's last ``KEEP_WINDOWS`` (by end) with the ones just
    read; a rank no longer reported is forgotten."""
    out: dict[int, dict[float | None, Evidence]] = {}
    for rank, (until, e) in now.items():
        mine = {**seen.get(rank, {}), until: e}
        out[rank] = dict(sorted(mine.items(), key=lambda kv: kv[0] or 0.0)[-KEEP_WINDOWS:])
    return out


def round_holders(statuses: Mapping[str, NodeStatus], round_no: int) -> dict[str, frozenset[int]]:
    """Each member's ranks in ``round_no``, as its report of that round lists them."""
    return {
        node: frozenset(p.rank for p in status.progress)
        for node, status in statuses.items()
        if status.round == round_no
    }


class StragglerJudge:
    """The verdicts of one round, on the node that judges it, and the drains its policy asks."""

    def __init__(self, spec: JobSpec, head: RoundHead, grace_s: float) -> None:
        self.job = spec.id
        self.round = head.round
        self._policy = spec.stragglers
        self._minimum = spec.nnodes.min
        self._size = head.size
        self._grace_s = grace_s
        self._verdicts = Verdicts()
        self._seen: dict[int, dict[float | None, Evidence]] = {}
        self._acted: set[str] = set()  # nodes drained (or kept at the minimum) once this round
        self._next_at = 0.0
        self.scores: dict[int, float] = {}

    async def evaluate(self, store: JobStore, now: float) -> None:
        """Read the round's reports, score every rank, say what changed and act by the policy
        (when due: ``evaluate_every``)."""
        if now < self._next_at:
            return
        self._next_at = now + evaluate_every(self._size)
        with contextlib.suppress(EtcdUnavailable):
            statuses = await store.statuses()
            self._seen = remember(self._seen, round_evidence(statuses, self.round))
            same = aligned(self._seen)
            if same is None:
                return  # the nodes' latest windows differ: judged once one window is everyone's
            self.scores = scores(same)
            self._verdicts, changes = judge(self._verdicts, self.scores, now)
            self._tell(changes)
            if self._policy is StragglerPolicy.DRAIN:
                await self._act(store, round_holders(statuses, self.round), now)

    async def _act(self, store: JobStore, holders: dict[str, frozenset[int]], now: float) -> None:
        v, size, least = self._verdicts, self._size, self._minimum
        due = drains(v, self.scores, holders, size, least, self._grace_s, now)
        for d in due:
            if d.node in self._acted:
                continue
            self._acted.add(d.node)
            match d:
                case Drain(node, rank, score):
                    await store.drain_member(node, DrainRecord(None, time.time(), DRAINED_BY))
                    publish(NodeDrained(node, self.job, None, DRAINED_BY, (self.job,), False))
                    _log.warning("straggler.drained", job=self.job, node=node, rank=rank, score=score)
                case Keep(node, rank, why):
                    _log.warning("straggler.kept", job=self.job, node=node, rank=rank, why=why)

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
