"""What a restarted daemon's recovery expects of the next round (elasticd.manager.recovery): the
previous round's members (``expect_members``: the record names none, whatever the job's size), of
which the leader waits for those still present in the job, this node among them once its scan
takes it back in; not a member whose presence went with its lease."""

from __future__ import annotations

from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.manager.recovery import _recover_job
from elasticd.rendezvous import decider as rdzv
from elasticd.rendezvous.model import Join
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import NodeRange
from tests.fakes import make_spec

KEYS = Keys("/t")


class PresentLease:
    """``JobLease`` over the job's presences in ``kv``."""

    def __init__(self, kv: MemoryKV, job: str) -> None:
        self._kv, self._job = kv, job
        self.lease_id: int | None = 1

    def lease_valid(self) -> bool:
        return True

    async def alive(self, among: frozenset[str] | None = None) -> frozenset[str]:
        nodes = frozenset(KEYS.parse(kv.key).node for kv in self._kv.get_prefix(KEYS.presences(self._job)))
        return nodes if among is None else nodes & among


def test_the_next_round_expects_the_present_members_and_this_node() -> None:
    kv = MemoryKV()
    spec = make_spec(nnodes=NodeRange(1, 3), max_restarts=3)
    store = InlineJobStore(kv, KEYS, spec.id)
    assert run_inline(store.create(spec))
    joins = [Join(n, f"h-{n}", 29500, 2) for n in ("n1", "n2", "n3")]
    lease = kv.grant_lease(60)
    for join in joins:
        run_inline(store.join(0, join, lease))
    epoch = next(j.create_revision for j in run_inline(store.read_rosters()).current_joins if j.node == "n1")
    assert run_inline(store.close(rdzv.build_result(0, joins, 1.0, epoch), "n1"))
    lease_of = PresentLease(kv, spec.id)
    for node in ("n1", "n2"):  # n3's presence went with its lease; n1 restarted and re-entered
        kv.put_json(KEYS.presence(spec.id, node), {})
    run_inline(_recover_job("n1", store, lease_of))
    read = run_inline(store.read_rosters())
    assert read.round is not None and read.round.round == 1
    assert read.round.expect == () and read.round.expect_members
    expect = rdzv.expected(read.round, read.previous_result)
    alive = run_inline(lease_of.alive())
    info = read.round
    late = info.opened_at + 1.0

    def decide(*joined: str) -> rdzv.CloseDecision:
        joins = [Join(n, f"h-{n}", 29500, 2) for n in joined]
        return rdzv.decide_close(
            info, joins, alive, spec.nnodes, now=late, last_join_at=late, last_call_s=30.0,
            join_timeout_s=600.0, expect_grace_s=0.0, expect=expect,
        )  # fmt: skip

    assert set(expect) == {"n1", "n2", "n3"} and alive == {"n1", "n2"}
    assert decide("n2").verdict is rdzv.Close.WAIT  # for n1, present
    assert decide("n2", "n1").verdict is rdzv.Close.NOW  # not for n3, gone
