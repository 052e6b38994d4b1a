"""The port filter follows the rounds: before this node's workers of a round start, its rules name
that round's members (a node that left is out of them from then on; one that joined is in)."""

from __future__ import annotations

from elasticd.jobs.agentstore import store_address
from elasticd.jobs.attempt import NodeRuntime
from elasticd.jobs.portguard import guard_of
from elasticd.portfilter.rules import Mode
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.terms.spec import JobSpec


async def follow_round(rt: NodeRuntime, store: JobStore, spec: JobSpec, head: RoundHead, me: Member) -> None:
    """Admit ``spec``'s round ``head`` to the node's filter. A round of this node alone needs no
    read; a larger one reads its members (one paged read, only with the filter on and a job the
    filter covers). The store's port is known in advance on group rank 0's node."""
    if rt.ports.mode is not Mode.ON or spec.uid <= 0:
        return
    members: tuple[Member, ...] | None = (me,)
    if head.size > 1:
        members = await store.members(head)
    ports = (head.master_port,) if me.group_rank == 0 else ()
    where = store_address(rt.address, spec.nnodes.max)
    await rt.ports.admit(guard_of(spec.id, spec.uid, members or (me,), where, ports))
