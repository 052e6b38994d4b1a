"""The slowness score and the straggler verdicts (pure), and the sampler that feeds them (with a
fake ``/proc``)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.progress import slowness as sl
from elasticd.progress.slowness import (
    Activity,
    ActivityWindow,
    Change,
    Evidence,
    Verdicts,
    classify,
    judge,
    scores,
)
from elasticd.progress.threadstate import ActivitySampler, look


@pytest.mark.parametrize(
    ("state", "wchan", "seen"),
    [
        ("R", "", Activity.OWN),  # running, or runnable (a throttled cgroup's task stays R)
        ("T", "", Activity.OWN),  # stopped from outside: the others wait for it
        ("D", "", Activity.OWN),  # its own I/O
        ("S", "futex_do_wait", Activity.WAITING),  # a collective's wait (kernel 6.x name)
        ("S", "futex_wait_queue_me", Activity.WAITING),  # (older kernels)
        ("S", "hrtimer_nanosleep", Activity.OWN),  # asleep in the script's own code
        ("S", "do_sys_poll", Activity.OWN),  # waiting for its data loader
        ("S", "0", None),  # the kernel did not say: not counted
        ("Z", "", None),
        ("X", "", None),
    ],
)
def test_classify(state: str, wchan: str, seen: Activity | None) -> None:
    assert classify(state, wchan) is seen


def _window(pattern: list[Activity], seconds: float, start: float = 1000.0) -> tuple[ActivityWindow, float]:
    """Looks every 0.05 s for ``seconds``, cycling through ``pattern``."""
    w = ActivityWindow()
    n = int(seconds / 0.05)
    for i, a in zip(range(n), itertools.cycle(pattern), strict=False):
        w.add(a, start + i * 0.05)
    return w, start + n * 0.05


def test_a_window_needs_enough_looks_before_it_says_anything() -> None:
    w, now = _window([Activity.OWN], sl.MIN_SPAN_S - 1)
    assert w.evidence(now) is None
    w, now = _window([Activity.OWN, Activity.WAITING], sl.MIN_SPAN_S + 1)
    e = w.evidence(now)
    assert e is not None and e.computing_s == pytest.approx(e.waiting_s, rel=0.05)


def test_a_window_forgets_what_is_older_than_it() -> None:
    w, now = _window([Activity.WAITING], 30)
    for i in range(int(sl.WINDOW_S / 0.05)):
        w.add(Activity.OWN, now + i * 0.05)
    e = w.evidence(now + sl.WINDOW_S)
    assert e is not None and e.waiting_s < 0.1 * e.computing_s
    assert e.span_s == pytest.approx(sl.WINDOW_S, rel=0.01)


def test_scores_name_the_rank_the_others_wait_for() -> None:
    # rank 1 stopped half of the time: it works 0.9 of the window, rank 0 0.45 (it waits the rest)
    s = scores({0: Evidence(9.0, 11.0), 1: Evidence(18.0, 2.0)})
    assert s[0] == 1.0 and s[1] == pytest.approx(0.5)
    # 20% slower
    assert scores({0: Evidence(16.0, 4.0), 1: Evidence(19.2, 0.8)})[1] == pytest.approx(0.833, abs=0.01)


def test_scores_need_two_ranks_and_work_to_compare() -> None:
    assert scores({0: Evidence(10.0, 10.0)}) == {}
    assert scores({0: Evidence(0.1, 19.9), 1: Evidence(0.1, 19.9)}) == {}  # all wait: a hang's business
    assert scores({0: Evidence(2.0, 2.0), 1: Evidence(18.0, 2.0)}) == {}  # too little seen of rank 0


@given(st.dictionaries(st.integers(0, 64), st.tuples(st.floats(0, 20), st.floats(0, 20)), min_size=2))
def test_scores_are_between_0_and_1_and_the_fastest_scores_1(raw: dict[int, tuple[float, float]]) -> None:
    s = scores({r: Evidence(c, w) for r, (c, w) in raw.items()})
    assert all(0 <= v <= 1 for v in s.values())
    if s:
        assert max(s.values()) == 1.0


def _run(series: list[dict[int, float]], every: float = 5.0) -> tuple[Verdicts, list[tuple[float, Change]]]:
    v, said = Verdicts(), []
    for i, current in enumerate(series):
        v, changes = judge(v, current, i * every)
        said += [(i * every, c) for c in changes]
    return v, said


def test_a_straggler_is_named_once_after_its_score_stayed_low_and_cleared_once() -> None:
    low, ok = {0: 1.0, 1: 0.5}, {0: 1.0, 1: 1.0}
    v, said = _run([low] * 6 + [ok] * 6)
    assert [(c.rank, c.straggler) for _, c in said] == [(1, True), (1, False)]
    assert said[0][0] >= sl.SUSTAIN_S and said[1][1].score == 1.0
    assert v.flagged == frozenset()


def test_a_score_near_the_line_does_not_flap() -> None:
    between = (sl.ENTER + sl.LEAVE) / 2
    _, said = _run([{0: 1.0, 1: 0.5}] * 4 + [{0: 1.0, 1: between}] * 20)
    assert [c.straggler for _, c in said] == [True]  # named, and never cleared while between the lines


def test_a_dip_shorter_than_the_sustain_names_nobody() -> None:
    _, said = _run([{0: 1.0, 1: 0.4}, {0: 1.0, 1: 0.4}, {0: 1.0, 1: 1.0}] * 10)
    assert said == []


def test_a_flagged_rank_that_is_no_longer_scored_is_cleared() -> None:
    v, _ = _run([{0: 1.0, 1: 0.5}] * 5)
    assert v.flagged == {1}
    v, changes = judge(v, {}, 100.0)
    assert changes == (Change(1, False, None),) and v.flagged == frozenset()
    assert sl.ended(Verdicts(flagged=frozenset({3, 1}))) == (Change(1, False, None), Change(3, False, None))


@given(st.lists(st.dictionaries(st.integers(0, 5), st.floats(0, 1)), max_size=40))
def test_verdicts_alternate_per_rank_and_match_the_flags(series: list[dict[int, float]]) -> None:
    v, said = _run(series)
    for rank in range(6):
        mine = [c.straggler for _, c in said if c.rank == rank]
        assert all(a != b for a, b in itertools.pairwise(mine))  # found, cleared, found, ...
        assert (rank in v.flagged) == (bool(mine) and mine[-1])


def test_the_sampler_counts_what_it_sees_and_stops_at_a_gone_pid() -> None:
    now = [1000.0]
    seen = {11: iter([("R", "")] * 200 + [None]), 22: iter([("S", "futex_do_wait")] * 400)}
    sampler = ActivitySampler([(0, 11), (1, 22)], clock=lambda: now[0], look_at=lambda pid: next(seen[pid]))
    for _ in range(300):
        sampler.sample_once()
        now[0] += 0.05
    busy, idle = sampler.evidence(0), sampler.evidence(1)
    assert busy is not None and busy.waiting_s == 0 and busy.computing_s > 9
    assert idle is not None and idle.computing_s == 0 and idle.waiting_s > 14
    assert sampler.evidence(7) is None


def test_look_reads_this_process_and_not_a_gone_one() -> None:
    import os

    state, _ = look(os.getpid()) or ("", "")
    assert state == "R"
    assert look(2**22 + 12345) is None


def _flagged(at: dict[int, float]) -> Verdicts:
    return Verdicts(flagged=frozenset(at), flagged_at=at)


def test_a_straggler_s_node_is_drained_after_the_grace_and_never_below_the_minimum() -> None:
    holders = {"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}
    v = _flagged({3: 100.0, 2: 110.0})
    assert sl.drains(v, {3: 0.5, 2: 0.4}, holders, 3, 1, 60.0, 159.0) == []  # within the grace
    assert sl.drains(v, {3: 0.5, 2: 0.4}, holders, 3, 1, 60.0, 171.0) == [sl.Drain("b", 2, 0.4)]
    kept = sl.drains(v, {}, holders, 3, 3, 60.0, 200.0)
    assert kept == [sl.Keep("b", 2, "the job needs 3 nodes and has 3")]


@given(
    st.dictionaries(st.integers(0, 15), st.floats(0, 200), max_size=16),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_drains_never_take_a_job_below_its_minimum(at: dict[int, float], size: int, minimum: int) -> None:
    holders = {f"n{i}": {4 * i + k for k in range(4)} for i in range(size)}
    out = sl.drains(_flagged(at), {}, holders, size, minimum, 30.0, 200.0)
    drained = [d.node for d in out if isinstance(d, sl.Drain)]
    assert size - len(drained) >= min(size, minimum)
    assert len(set(drained)) == len(drained)
    for d in out:
        assert d.rank in holders[d.node] and 200.0 - at[d.rank] >= 30.0


def test_the_judge_reads_a_large_round_less_often() -> None:
    from elasticd.agent.stragglers import EVALUATE_S, evaluate_every

    assert evaluate_every(2) == EVALUATE_S == evaluate_every(1000)
    assert evaluate_every(12_500) == 62.5 and evaluate_every(100_000) == 500.0
