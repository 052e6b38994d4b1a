"""What a ``logs`` request may ask for, and what it is told about the job besides its output.

Pure: a read of a job and the logs this node holds in, an answer or an error out.
"""

from __future__ import annotations

from collections.abc import Collection

from elasticd.errors import AttemptNotFound, RankNotFound
from elasticd.rendezvous.jobread import JobRead
from elasticd.wire import RoundView


def round_view(read: JobRead) -> RoundView | None:
    """The current round, as a following client reports the job's life from it."""
    info = read.round
    if info is None:
        return None
    result = read.closed
    return {
        "round": info.round,
        "reason": info.reason.value,
        "detail": info.detail,
        "spends_restart": info.reason.spends_budget,
        "opened_at": info.opened_at,
        "closed_at": result.closed_at if result is not None and result.closed_at else None,
    }


def spans(ranks: Collection[int]) -> str:
    """``0-3, 6`` for {0, 1, 2, 3, 6}."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def check_scope(
    read: JobRead, rank: int | None, attempt: int | None, here: Collection[tuple[int, int]]
) -> None:
    """Refuse a rank the job does not have and never will, and an attempt it has not come to.

    ``here``: (attempt, rank) of the logs this node holds. A rank exists when it has logs here or
    is in one of the rounds etcd still holds (the current one and the one before); a rank the job
    could still get (an elastic job below its maximum) is not refused while the job runs."""
    if attempt is not None and attempt > read.current and all(a != attempt for a, _ in here):
        so_far = spans(range(read.current + 1))
        raise AttemptNotFound(
            f"job {read.job_id} has no attempt {attempt} (its attempts so far: {so_far})",
            attempt=attempt,
            last=read.current,
        )
    if rank is None or any(r == rank for _, r in here):
        return
    ran = {r for _, r in here}
    for round_no in read.rounds():  # a round's ranks are 0..world_size-1: its head says
        closed = read.head_of(round_no)
        ran.update(range(closed.world_size if closed is not None else 0))
    if rank in ran:
        return  # on another node: the client says where
    head = read.head
    if head is not None and rank >= head.nnodes.max * head.nproc_per_node:
        raise RankNotFound(
            f"job {read.job_id} has no rank {rank}: it has at most {head.nnodes.max * head.nproc_per_node} "
            f"({head.nnodes.max} node(s) x {head.nproc_per_node} per node)",
            rank=rank,
        )
    if read.ended:
        known = f"its ranks were {spans(ran)}" if ran else "no rank of it ever ran"
        raise RankNotFound(f"job {read.job_id} has no rank {rank}: {known}", rank=rank)
