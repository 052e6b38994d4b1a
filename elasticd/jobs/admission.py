"""Pure rule: should this node take part in a job it is not yet part of?"""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.rendezvous.store import JobSnapshot


@dataclass(frozen=True)
class Admission:
    join: bool
    note: str | None = None  # why this node, though allowed, cannot take part now (shown by status)


def admit(
    snap: JobSnapshot, node: str, free_slots: int, total_slots: int, unit: str, draining: bool = False
) -> Admission:
    """A drained node (node-wide, or for this job) joins nothing; others join where there is a seat."""
    spec = snap.spec
    if spec is None or snap.final is not None or snap.round is None or not spec.allows(node):
        return Admission(False)
    if draining or node in snap.drains:
        return Admission(False)
    result = snap.result
    if result is not None:
        seats = spec.nnodes.max - len(result.members)  # a running round: join at the next one
    else:
        seats = spec.nnodes.max - len(snap.current_joins)
    if seats <= 0:
        return Admission(False)
    if free_slots < spec.nproc_per_node:
        need = spec.nproc_per_node
        return Admission(
            False, f"{node} is waiting for {need} free {unit} ({free_slots} of {total_slots} free now)"
        )
    return Admission(True)
