"""elasticd.agent.record.Part: the agent's sub-state beside ``AgentState``, and its transitions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.agent.record import AgentRecord, Part
from tests.agent_steps import SPEC

parts = st.builds(Part, st.booleans(), st.booleans(), st.booleans(), st.integers(-1, 5))

# Each transition, and the only fields it may change.
TRANSITIONS: dict[str, tuple[Callable[[Part], Part], set[str]]] = {
    "lead(True)": (lambda p: p.lead(True), {"leading"}),
    "lead(False)": (lambda p: p.lead(False), {"leading"}),
    "withdrawn": (Part.withdrawn, {"leading"}),
    "started(True)": (lambda p: p.started(True), {"solo"}),
    "started(False)": (lambda p: p.started(False), {"solo"}),
    "stopped": (Part.stopped, {"solo"}),
    "fence": (Part.fence, {"fenced"}),
    "fenced_at(3)": (lambda p: p.fenced_at(3), {"fenced_round"}),
    "unfence": (Part.unfence, {"fenced"}),
}


def changed(a: Part, b: Part) -> set[str]:
    return {f for f in ("leading", "solo", "fenced", "fenced_round") if getattr(a, f) != getattr(b, f)}


@given(parts, st.sampled_from(sorted(TRANSITIONS)))
def test_each_transition_changes_only_its_own_flag(part: Part, name: str) -> None:
    move, allowed = TRANSITIONS[name]
    if not part.fenced and name in ("unfence", "fenced_at(3)"):
        with pytest.raises(ValueError):
            move(part)
        return
    assert changed(part, move(part)) <= allowed


def test_the_fence_cycle() -> None:
    part = Part(solo=False).started(False)
    fenced = part.fence()
    assert fenced.fenced and fenced.fenced_round == -1
    stopped = fenced.fenced_at(2).stopped()
    back = stopped.unfence()
    assert (back.fenced, back.fenced_round, back.solo) == (False, 2, False)  # round 2 is reported once


def test_only_a_fenced_part_is_unfenced_or_stops_for_the_fence() -> None:
    with pytest.raises(ValueError):
        Part().unfence()
    with pytest.raises(ValueError):
        Part().fenced_at(1)


def test_leading_and_solo() -> None:
    assert Part().lead(True).leading and not Part(leading=True).withdrawn().leading
    assert Part().started(True).solo and not Part(solo=True).stopped().solo


def test_the_record_reads_its_part() -> None:
    rec = AgentRecord(SPEC, "n1", part=Part(leading=True, solo=True, fenced=True, fenced_round=4))
    assert (rec.leading, rec.solo, rec.fenced, rec.fenced_round) == (True, True, True, 4)
    assert AgentRecord(SPEC, "n1").part == Part()
