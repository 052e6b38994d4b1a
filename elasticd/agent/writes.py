"""The job's records an agent writes that outlive its lease: its marks in the round's records, and
the compare-and-swaps of the round's and the job's records. The executor (``agent.executor``)
hands each over as ``step`` asked for it; nothing is decided here."""

from __future__ import annotations

from elasticd.agent import actions as act
from elasticd.agent import conduct
from elasticd.happenings.bus import publish
from elasticd.rendezvous.jobstore import JobStore

Swap = act.CloseRound | act.Bump | act.Amend | act.Finalize


async def mark(store: JobStore, node: str, action: act.Mark) -> None:
    """Our marks in the job's records (not under our lease now: they outlive it, remove what it
    held, or go with our join)."""
    match action:
        case act.Withdraw(round_no):
            await store.withdraw(round_no, node)
        case act.ClaimLead(round_no, epoch, lease):
            await store.claim_lead(round_no, node, epoch, lease)
        case act.ClearWaiting():
            await store.clear_waiting(node)
        case act.MarkDone(round_no):
            await store.mark_done(round_no, node)
        case act.MarkLeft(round_no):
            await store.mark_left(round_no, node)


async def swap(store: JobStore, node: str, round_no: int, action: Swap) -> None:
    """A compare-and-swap on the round's or the job's record; when it took, its event (``round_no``:
    the round the agent runs)."""
    match action:
        case act.CloseRound(result):
            took = await store.close(result, node)
        case act.Bump(seen, info, spend):
            took = await store.bump(seen, info, spend)
        case act.Amend(seen_mod, record):
            took = await store.amend(seen_mod, record)
        case act.Finalize(state, code, reason, failure):
            took = await store.finalize(state, code, reason, failure)
    if took:
        publish(conduct.took(action, store.job_id, node, round_no))
        if isinstance(action, act.CloseRound):
            await store.forget_rounds_before(action.result.round)
