"""The base of ``step``'s working state, and its reachability rules (``rendezvous.reach``): the
round's leader closes with the joiners it reaches (probing first), hands the round on when it
reaches too few, and a node outside a running round asks back only once it reaches every member.
Pure, as ``step`` is: it only records what to do."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from elasticd.agent.actions import (
    Action,
    CheckNodes,
    CloseRound,
    Finalize,
    MarkLeft,
    NotePending,
    Probe,
    Wait,
    Withdraw,
)
from elasticd.agent.record import AgentRecord, Local
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous import fitness, reach
from elasticd.rendezvous.jobread import JoinsRead
from elasticd.rendezvous.model import RoundInfo, RoundResult
from elasticd.terms.state import EndReason, JobState


class StepBase:
    """What one call of ``step`` has decided so far: the record and the actions."""

    def __init__(self, rec: AgentRecord, local: Local, now: float) -> None:
        self.rec = rec
        self.local = local
        self.now = now
        self.actions: list[Action] = []

    def _do(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def _set(self, **changes: Any) -> None:
        self.rec = replace(self.rec, **changes)

    def _note(self, note: str | None) -> None:
        """Say why we wait in the job's pending notes (None: we no longer do), once per change."""
        if note != self.rec.note and self.local.lease is not None:
            self._set(note=note)
            self._do(NotePending(note))

    def _close(self, read: JoinsRead, info: RoundInfo, why: str, previous: RoundResult | None) -> None:
        """Close the round with the joiners we can reach (``rendezvous.reach``), probing first;
        ``previous``: the round before, whole (stable ranks)."""
        rec, spec = self.rec, self.rec.spec
        deadline = info.opened_at + spec.join_timeout_s
        got = reach.admit(
            info.round,
            read.current_joins,
            rec.node,
            self.local.reach,
            spec.nnodes.min,
            now=self.now,
            deadline=deadline,
        )
        if got.verdict is reach.Admit.GO and spec.node_check:
            fit = fitness.admit(
                info.round,
                got.joins,
                rec.node,
                self.local.checked,
                spec.nnodes.min,
                now=self.now,
                deadline=deadline,
            )
            if fit.verdict is reach.Admit.PROBE:
                self._do(CheckNodes(info.round, fit.targets))  # then step again, with what it found
                return
            got = _after(got, fit)
        match got.verdict:
            case reach.Admit.PROBE:
                self._do(Probe(info.round, got.targets))  # then step again, with what it found
            case reach.Admit.WITHDRAW:
                # Most likely the cut one: let the next oldest lead, and join after it (a new join
                # is younger than theirs). A node left out of a round is not a failure. ``left``
                # says that our workers are stopped (we joined): the round need not wait for us.
                self._set(
                    part=self.rec.part.withdrawn(),
                    joined_round=-1,
                    rejoin_at=self.now + reach.REJOIN_BACKOFF_S,
                )
                self._note(got.why)
                self._do(Withdraw(info.round), MarkLeft(info.round), Wait(self.rec.rejoin_at))
            case reach.Admit.WAIT:
                self._note(got.why)
                self._do(Wait(got.recheck_at))
            case reach.Admit.FAIL:
                self._do(Finalize(JobState.FAILED, EndReason.JOIN_TIMEOUT, got.why))
            case reach.Admit.GO:
                self._note(None)
                ordered = rdzv.order_members(got.joins, previous, spec.nnodes.max)
                why = f"{why}; {got.why}" if got.why else why
                # The epoch ties the round's head to the assignments we write (``roster``).
                epoch = next((j.create_revision for j in read.current_joins if j.node == rec.node), 0)
                self._do(CloseRound(rdzv.build_result(info.round, ordered, self.now, epoch), why, info))

    def _ready(self, read: JoinsRead, result: RoundResult, alive: frozenset[str]) -> bool:
        """Whether we reach every member of the running round, and so may ask to be taken in."""
        # Only the members still in it: one that is done, or whose lease is gone (its daemon
        # died: nothing listens), has no collective left to stall.
        done = read.done_in(read.current)
        members = [m for m in result.members if m.node in alive and m.node not in done]
        got = reach.ready(read.current, members, self.rec.node, self.local.reach, self.now)
        if got.verdict is reach.Admit.PROBE:
            self._do(Probe(read.current, got.targets))
            return False
        if got.verdict is reach.Admit.WAIT:
            self._note(got.why)
            self._do(Wait(got.recheck_at))
            return False
        self._note(None)
        return True


def _after(reached: reach.Admission, fit: reach.Admission) -> reach.Admission:
    """The node check's verdict on the joiners ``reach`` let in, saying who either left out."""
    if fit.verdict is not reach.Admit.GO:
        return fit
    why = "; ".join(w for w in (reached.why, fit.why) if w)
    return replace(fit, left_out=reached.left_out + fit.left_out, why=why)
