"""What a restarted daemon's recovery expects of the next round (elasticd.manager.recovery): the
members still present in the job, and this node (registered again, its scan takes it back in);
not a member whose presence went with its lease."""

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

    async def alive(self) -> frozenset[str]:
        return frozenset(KEYS.parse(kv.key).node for kv in self._kv.get_prefix(KEYS.presences(self._job)))


def test_the_next_round_expects_the_present_members_and_this_node() -> None:
    kv = MemoryKV()
    spec = make_spec(nnodes=NodeRange(1, 3), max_restarts=3)
    store = InlineJobStore(kv, KEYS, spec.id)
    assert run_inline(store.create(spec))
    joins = [Join(n, f"h-{n}", 29500, 2) for n in ("n1", "n2", "n3")]
    assert run_inline(store.close(rdzv.build_result(0, joins, 1.0)))
    kv.put_json(KEYS.presence(spec.id, "n2"), {})  # n3's presence went with its lease; n1 restarted
    run_inline(_recover_job("n1", store, PresentLease(kv, spec.id)))
    snap = run_inline(store.snapshot())
    assert snap.round is not None and snap.round.round == 1
    assert set(snap.round.expect) == {"n1", "n2"}
