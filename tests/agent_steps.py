"""Builders for unit tests of the agent's step function (``elasticd.agent.step``).

A test states a record, what this node knows (``Local``) and a read of the job, and drives
``step`` as the executor would: ``cycle`` is one pass (the step before a read, then the step on
what was read), ``run`` a few passes in a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elasticd.agent.actions import (
    Action,
    Bump,
    ClearWaiting,
    CloseRound,
    Finalize,
    Join,
    MarkDone,
    MarkLeft,
    Publish,
    ReadJob,
    SetWaiting,
    StartWorkers,
    StopWorkers,
    WatchPeers,
    Withdraw,
)
from elasticd.agent.record import AgentRecord, AgentState, Local, Observed, Part
from elasticd.agent.step import step
from elasticd.jobs.decider import Group, GroupOutcome
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous import model
from elasticd.rendezvous.jobread import InvalidKey, RostersRead
from elasticd.rendezvous.model import DrainRecord, FinalRecord, Member, RoundInfo, RoundResult
from elasticd.terms.spec import JobSpec, NodeRange
from elasticd.terms.state import EndReason, JobState, RoundReason, WorkerFailure
from tests import fakes

JOB = fakes.JOB
ME = "n1"
LEASE = 4242
NOW = 1_000.0
OPENED_AT = NOW - 5.0
ALL = frozenset({"n1", "n2", "n3", "n4"})
STOP_GRACE_S = 10.0
WRITES = (
    Publish,
    Join,
    Withdraw,
    SetWaiting,
    ClearWaiting,
    CloseRound,
    Bump,
    Finalize,
    MarkDone,
    MarkLeft,
    StartWorkers,
    StopWorkers,
)


def spec(nnodes: str = "2:3", **overrides: Any) -> JobSpec:
    """nnodes MIN:MAX, 3 restarts, a 10 s stop grace, a 2 s last call, a 60 s join timeout."""
    fields: dict[str, Any] = {
        "nnodes": NodeRange.parse(nnodes),
        "max_restarts": 3,
        "stop_grace_s": STOP_GRACE_S,
        "last_call_s": 2.0,
        "join_timeout_s": 60.0,
    }
    return fakes.make_spec(**(fields | overrides))


SPEC = spec()


def join(node: str, rev: int) -> model.Join:
    """``node``'s join, created at revision ``rev`` under its own lease."""
    return model.Join(node, f"h-{node}", 29500 + rev, 2, create_revision=rev, lease=7000 + rev)


def result(round_no: int, nodes: Sequence[str], closed_at: float = NOW - 1.0) -> RoundResult:
    """Round ``round_no``'s result: ``nodes`` in group-rank order."""
    return rdzv.build_result(round_no, [join(n, 10 + i) for i, n in enumerate(nodes)], closed_at)


def job_read(
    round_no: int = 1,
    *,
    job: JobSpec = SPEC,
    joins: Sequence[str] = (),
    members: Sequence[str] | None = None,
    counted: bool = False,
    reason: RoundReason = RoundReason.START,
    opened_at: float = OPENED_AT,
    expect: Sequence[str] = (),
    grace_s: float | None = None,
    restarts: int = 0,
    previous: Sequence[str] | None = None,
    done: Sequence[str] = (),
    left: Sequence[str] = (),
    waiting: Sequence[str] = (),
    drains: Sequence[str] = (),
    final: JobState | None = None,
    invalid: bool = False,
    lead: str | None = None,
) -> RostersRead:
    """The job in round ``round_no``: ``joins`` in create-revision order, ``members`` its result,
    ``lead`` the node its lead key names (``JobStore.claim_lead``).

    With ``counted`` the round's joins are only counted, as a running member reads them. The
    round's and the restart counter's mod revisions follow from ``round_no`` and ``restarts``.
    """
    these = tuple(join(n, 10 + i) for i, n in enumerate(joins))
    results = {}
    if members is not None:
        results[round_no] = result(round_no, members)
    if previous is not None:
        results[round_no - 1] = result(round_no - 1, previous, OPENED_AT - 100.0)
    ended = None
    if final is not None:
        code = {JobState.SUCCEEDED: EndReason.SUCCEEDED, JobState.KILLED: EndReason.KILLED}
        ended = FinalRecord(final, "ended", code.get(final, EndReason.WORKER_FAILED), None, NOW - 1.0)
    bad = InvalidKey(f"jobs/{JOB}/rdzv/{round_no}/join/n9", "port: must be int", 77)
    return RostersRead(  # its rounds whole
        JOB,
        head=fakes.head_of(job),
        found=10,
        round=RoundInfo(round_no, reason, opened_at, tuple(expect), grace_s=grace_s),
        round_mod=100 + round_no,
        restarts=restarts,
        restarts_mod=50 + restarts,
        join_counts={round_no: len(these)} if counted else {},
        joins={} if counted else {round_no: these},
        results=results,
        leads={round_no: lead} if lead is not None else {},
        done={round_no: frozenset(done)} if done else {},
        left={round_no: frozenset(left)} if left else {},
        waiting={n: model.WaitingRecord(NOW - 1.0) for n in waiting},
        drains={n: DrainRecord(None, NOW - 1.0, "op") for n in drains},
        final=ended,
        invalid=(bad,) if invalid else (),
    )


def record(
    state: AgentState = AgentState.RUNNING, round_no: int = 1, *, job: JobSpec = SPEC, **fields: Any
) -> AgentRecord:
    """A record; the ``Part`` flags (leading, solo, fenced, fenced_round) may be given as fields."""
    part = Part(**{k: fields.pop(k) for k in ("leading", "solo", "fenced", "fenced_round") if k in fields})
    return AgentRecord(job, ME, state=state, round=round_no, part=part, **fields)


def joining(round_no: int, *, leading: bool = False, ran: int = -1, **fields: Any) -> AgentRecord:
    """Joined ``round_no`` (after running round ``ran``)."""
    return record(AgentState.JOINING, ran, joined_round=round_no, leading=leading, **fields)


def failure(oom: bool = False, node: str = ME, attempt: int = 1) -> WorkerFailure:
    code = -9 if oom else 1
    return WorkerFailure.from_exit(
        node=node, attempt=attempt, rank=1, local_rank=1, returncode=code, message="", tail="boom\n", oom=oom
    )


RUNNING = Group(GroupOutcome.RUNNING)
SUCCEEDED = Group(GroupOutcome.SUCCEEDED)


def failed(what: WorkerFailure | None = None, **fields: Any) -> Group:
    return Group(GroupOutcome.FAILED, what, **fields)


def local(group: Group | None = None, **fields: Any) -> Local:
    """What this node knows: a valid lease by default."""
    return Local(**({"lease": LEASE} | fields), group=group)


def following(round_no: int, group: Group | None = None) -> Local:
    """What a leader knows while its watch follows round ``round_no``'s joins."""
    return local(group, joins_followed=round_no)


def member(read: RostersRead, node: str = ME) -> Member:
    res = read.result
    assert res is not None
    found = res.member(node)
    assert found is not None
    return found


def decide(
    rec: AgentRecord,
    read: RostersRead,
    here: Local | None = None,
    alive: frozenset[str] = ALL,
    now: float = NOW,
) -> tuple[AgentRecord, list[Action]]:
    """The step on a full read."""
    return step(rec, Observed(read, alive), here or local(), now)


def acts(actions: list[Action]) -> list[Action]:
    """The actions after the peer watch a step on a full read always starts with."""
    assert actions and isinstance(actions[0], WatchPeers), actions
    return actions[1:]


def writes(actions: list[Action]) -> list[Action]:
    return [a for a in actions if isinstance(a, WRITES)]


def cycle(
    rec: AgentRecord,
    read: RostersRead,
    here: Local | None = None,
    alive: frozenset[str] = ALL,
    now: float = NOW,
) -> tuple[AgentRecord, list[Action]]:
    """One executor pass: the step before a read asks for one, then decides on ``read``."""
    here = here or local()
    rec, asked = step(rec, None, here, now)
    assert len(asked) == 1 and isinstance(asked[0], ReadJob), asked
    return step(rec, Observed(read, alive), replace_local(here), now)


def replace_local(here: Local) -> Local:
    """What the node knows on the step after a read: the last action's report is consumed."""
    return Local(here.lease, here.lease_valid, here.group)


def run(
    rec: AgentRecord, *reads: RostersRead, here: Local | None = None, alive: frozenset[str] = ALL
) -> tuple[AgentRecord, list[list[Action]]]:
    """A pass per read, as if each pass's writes did not change what the next one reads."""
    out = []
    for read in reads:
        rec, actions = cycle(rec, read, here, alive)
        out.append(actions)
    return rec, out
