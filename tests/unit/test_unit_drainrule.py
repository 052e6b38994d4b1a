"""The drain rule: a node leaves its jobs, refused unforced where a job would drop below MIN."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticd.manager.drainrule import Membership, judge_drain


def test_a_drain_that_keeps_every_job_at_its_minimum_goes_ahead() -> None:
    verdict = judge_drain("n1", [Membership("a", 3, 2), Membership("b", 2, 1)], force=False)
    assert verdict.affected == ("a", "b")
    assert verdict.refusal == "" and not verdict.forced


def test_a_drain_below_a_minimum_is_refused_with_the_job_named_unless_forced() -> None:
    members = [Membership("a", 3, 2), Membership("b", 2, 2)]
    refused = judge_drain("n1", members, force=False)
    assert "b (needs 2 nodes, has 2)" in refused.refusal and "--force" in refused.refusal
    assert "a (" not in refused.refusal
    forced = judge_drain("n1", members, force=True)
    assert forced.refusal == "" and forced.forced and forced.too_small == ("b (needs 2 nodes, has 2)",)


def test_a_node_in_no_running_job_drains_freely() -> None:
    verdict = judge_drain("n1", [], force=False)
    assert verdict.affected == () and verdict.refusal == "" and not verdict.forced


@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 64)), max_size=8), st.booleans())
def test_refused_exactly_when_unforced_and_some_job_drops_below_its_minimum(
    sizes: list[tuple[int, int]], force: bool
) -> None:
    members = [Membership(f"j{i}", size, minimum) for i, (size, minimum) in enumerate(sizes)]
    verdict = judge_drain("n1", members, force)
    below = any(size - 1 < minimum for size, minimum in sizes)
    assert bool(verdict.refusal) == (below and not force)
    assert verdict.forced == below
    assert verdict.affected == tuple(m.job_id for m in members)
