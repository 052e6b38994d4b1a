"""Whether a drain may go ahead: the rule that keeps a job at its minimum size (pure).

A node drained out of a running job leaves it one node smaller; a job that would drop below its
``--nnodes`` minimum would stop and wait for a replacement, so such a drain needs ``--force``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Membership:
    """A running job whose current round has the node to drain as a member."""

    job_id: str
    size: int  # the nodes in its current round
    minimum: int  # the least it may run with (--nnodes MIN)


@dataclass(frozen=True)
class DrainVerdict:
    affected: tuple[str, ...]  # the jobs the node leaves
    too_small: tuple[str, ...]  # of those, the ones that go below their minimum, described
    refusal: str  # why the drain is refused ("": it may go ahead)

    @property
    def forced(self) -> bool:
        return bool(self.too_small)


def judge_drain(node: str, members: list[Membership], force: bool) -> DrainVerdict:
    """The jobs ``node`` leaves, and a refusal when one would drop below its minimum unforced."""
    too_small = tuple(
        f"{m.job_id} (needs {m.minimum} nodes, has {m.size})" for m in members if m.size - 1 < m.minimum
    )
    refusal = ""
    if too_small and not force:
        refusal = (
            f"draining {node} would take job(s) below their minimum: {', '.join(too_small)}; "
            "use --force to drain anyway (the job then waits for a replacement node)"
        )
    return DrainVerdict(tuple(m.job_id for m in members), too_small, refusal)
