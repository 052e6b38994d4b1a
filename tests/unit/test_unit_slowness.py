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
from elasticd.progress.threadstate import ActivitySampler, cpu_times, look


@pytest.mark.parametrize(
    ("state", "wchan", "seen"),
    [
        ("R", "", Activity.RUNNABLE),  # running, or runnable (a throttled cgroup's task stays R)
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

    def cpu_of(pid: int) -> tuple[float, float]:
        t = now[0] - 1000.0  # rank 0 runs 70% of the time and waits for a CPU 20%
        return (0.7 * t, 0.2 * t) if pid == 11 else (0.0, 0.0)

    sampler = ActivitySampler(
        [(0, 11), (1, 22)], clock=lambda: now[0], look_at=lambda pid: next(seen[pid]), cpu_of=cpu_of
    )
    for _ in range(300):
        sampler.sample_once()
        now[0] += 0.05
    busy, idle = sampler.evidence(0), sampler.evidence(1)
    assert busy is not None and busy.waiting_s == 0 and busy.computing_s > 9
    assert busy.queued_s == pytest.approx(1.9, abs=0.2)  # read once a second, for its 10 s
    assert idle is not None and idle.computing_s == 0 and idle.waiting_s > 14 and idle.queued_s == 0
    assert sampler.evidence(7) is None
    until, pooled = sampler.evidence_all()
    assert until == sl.aligned_end(now[0]) and until % sl.ALIGN_S == 0 and now[0] - until < sl.ALIGN_S
    assert pooled[0].queued_s == pytest.approx(busy.queued_s / 2, rel=0.1)  # its node's mean


def test_look_reads_this_process_and_not_a_gone_one() -> None:
    import os

    state, _ = look(os.getpid()) or ("", "")
    assert state == "R"
    assert look(2**22 + 12345) is None
    run, delay = cpu_times(os.getpid()) or (-1.0, -1.0)
    assert run > 0 and delay >= 0 and cpu_times(2**22 + 12345) is None


def test_a_window_takes_cpu_time_from_the_kernel_and_splits_the_rest_by_its_looks() -> None:
    w = ActivityWindow()
    for i in range(240):  # 12 s of looks at a sleeping thread, half in a collective
        w.add(Activity.OWN if i % 2 else Activity.WAITING, 1000.0 + i * 0.05)
        if i % 20 == 0:  # and each second it ran 0.3 s and waited 0.2 s for a CPU
            w.cpu(0.3, 0.2, 1000.0 + i * 0.05)
    w.cpu(float("nan"), -1.0, 1011.9)
    e = w.evidence(1012.0)
    assert e is not None and e.span_s == pytest.approx(12.0)
    assert e.queued_s == pytest.approx(2.4, abs=0.01) and e.waiting_s == pytest.approx(3.0, abs=0.01)
    w.cpu(50.0, 50.0, 1011.95)  # more than the window (a counter that jumped): within it
    e = w.evidence(1012.0)
    assert e is not None and e.waiting_s == 0 and e.computing_s == pytest.approx(12.0)
    assert 0 < e.queued_s <= e.computing_s


def test_without_the_kernel_s_cpu_times_the_looks_say_it_all() -> None:
    w, now = _window([Activity.RUNNABLE, Activity.OWN, Activity.WAITING, Activity.WAITING], 12)
    e = w.evidence(now)
    assert e is not None and e.own == pytest.approx(0.5, abs=0.01) and e.queued_s == 0


def test_a_loaded_host_names_no_rank_of_its_own_but_a_slower_node_still_holds_the_straggler() -> None:
    # Seen on a 2-core host loaded by 3 other processes (a healthy single-node job): rank 0 waited
    # for a CPU 48% of the window, rank 1 37%, and rank 1 waited that much longer in collectives.
    loaded = {0: Evidence(14.8, 5.2, 9.7), 1: Evidence(12.4, 7.6, 7.3)}
    assert scores(loaded)[0] < sl.ENTER  # unpooled: rank 0 named
    assert min(scores(sl.pool(loaded)).values()) > sl.LEAVE
    # Another node's rank held to a CPU quota: its node's wait stays its own.
    other = {2: Evidence(17.0, 3.0, 12.0)}
    s = scores(sl.pool(loaded) | sl.pool(other))
    assert s[2] < sl.ENTER and min(s[0], s[1]) > sl.LEAVE


_EVIDENCE = st.tuples(st.floats(0.5, 20), st.floats(0, 1), st.floats(0, 1)).map(
    lambda t: Evidence(round(t[0] * t[1], 3), round(t[0] * (1 - t[1]), 3), round(t[0] * t[1] * t[2], 3))
)


@given(st.dictionaries(st.integers(0, 64), _EVIDENCE, max_size=16))
def test_pooling_keeps_each_window_and_shares_the_wait_for_a_cpu(raw: dict[int, Evidence]) -> None:
    pooled = sl.pool(raw)
    assert pooled.keys() == raw.keys()
    for rank, e in pooled.items():
        assert e.span_s == pytest.approx(raw[rank].span_s, abs=0.002)
        assert 0 <= e.queued_s <= e.computing_s
    if len(raw) == 1:
        assert all(e.computing_s == pytest.approx(raw[r].computing_s, abs=0.002) for r, e in pooled.items())


@given(st.floats(1, 20), st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=16))
def test_pooling_moves_cpu_waits_between_ranks_and_keeps_their_sum(
    span: float, raw: list[tuple[float, float]]
) -> None:
    ev = {
        r: Evidence(round(span * own, 3), round(span * (1 - own), 3), round(span * own * q, 3))
        for r, (own, q) in enumerate(raw)
    }
    mean = sum(e.queued_s for e in ev.values()) / len(ev)
    if all(0 <= e.computing_s - e.queued_s + mean <= e.span_s for e in ev.values()):  # nothing clipped
        pooled = sl.pool(ev).values()
        assert sum(e.computing_s for e in pooled) == pytest.approx(
            sum(e.computing_s for e in ev.values()), abs=0.01 * len(ev)
        )
        assert sum(e.queued_s for e in pooled) == pytest.approx(
            sum(e.queued_s for e in ev.values()), abs=0.01 * len(ev)
        )


@given(
    st.floats(1, 10),
    st.lists(st.floats(0, 1), min_size=2, max_size=8),
    st.floats(0, 0.3),
)
def test_ranks_that_run_alike_score_alike_however_the_cpu_waits_split(
    run_s: float, splits: list[float], other_s: float
) -> None:
    # Every rank of one node runs ``run_s`` of a 20 s window; the host's CPUs keep them waiting
    # ``queued`` seconds in all, split any way; what one rank waits for a CPU, the others wait for
    # it in the collectives.
    queued = 8.0
    q = [queued * x / sum(splits) if sum(splits) else 0.0 for x in splits]
    ev = {r: Evidence(round(run_s + other_s + qr, 3), round(20 - run_s - other_s - qr, 3), round(qr, 3))
          for r, qr in enumerate(q)}  # fmt: skip
    s = scores(sl.pool(ev))
    assert all(v > 0.99 for v in s.values()), s


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


def test_a_window_can_end_on_a_boundary_already_past() -> None:
    w, now = _window([Activity.OWN], 9)  # 1000.0 .. 1009.0
    w2, _ = _window([Activity.OWN] * 3 + [Activity.WAITING] * 1, 30)  # own 3/4 of the looks
    for i in range(int(6 / 0.05)):
        w.add(Activity.WAITING, now + i * 0.05)  # then 6 s waiting
    assert sl.aligned_end(now + 6) == 1015.0
    early = w.evidence(1005.0)  # 5 s: too little seen then
    assert early is None
    e = w.evidence(1015.0)
    assert (
        e is not None
        and e.computing_s == pytest.approx(9.0, abs=0.1)
        and e.waiting_s == pytest.approx(6.0, abs=0.1)
    )
    e2 = w2.evidence(1030.0)
    assert e2 is not None and e2.own == pytest.approx(0.75, abs=0.01) and e2.span_s == pytest.approx(20.0)


def test_ranks_that_differ_by_less_than_the_noise_all_score_1() -> None:
    # A slow link: every rank waits in the collectives ~96% of the window, and own shares differ
    # by a few hundredths, which is noise: the job would be no faster without any of them.
    s = scores({0: Evidence(0.85, 19.15), 1: Evidence(1.5, 18.5), 2: Evidence(1.2, 18.8)})
    assert s == {0: 1.0, 1: 1.0, 2: 1.0}
    s = scores({0: Evidence(0.85, 19.15), 1: Evidence(2.0, 18.0)})  # 5.75% of the window more
    assert s[1] == pytest.approx(0.425, abs=0.01)


E1, E2, E3 = Evidence(10.0, 10.0), Evidence(12.0, 8.0), Evidence(14.0, 6.0)


def test_the_judge_compares_windows_that_end_together() -> None:
    assert sl.aligned({0: {100.0: E1, 105.0: E2}, 1: {95.0: E1, 100.0: E3}}) == {0: E1, 1: E3}
    assert sl.aligned({0: {105.0: E2}, 1: {100.0: E3}}) is None  # none in common: not judged
    assert sl.aligned({0: {100.0: E1}, 1: {None: E2}}) == {0: E1, 1: E2}  # an older daemon: any end
    assert sl.aligned({0: {None: E1}, 1: {None: E2}}) == {0: E1, 1: E2}
    assert sl.aligned({}) == {}


def test_the_judge_remembers_a_few_windows_of_each_rank_it_still_hears_of() -> None:
    from elasticd.agent.stragglers import KEEP_WINDOWS, remember

    seen: dict[int, dict[float | None, Evidence]] = {}
    for t in range(0, 50, 5):
        seen = remember(seen, {0: (float(t), E1), 1: (float(t - 5), E2)})
    assert len(seen[0]) == len(seen[1]) == KEEP_WINDOWS and max(seen[0]) == 45.0  # type: ignore[type-var]
    assert sl.aligned(seen) == {0: E1, 1: E2}
    assert remember(seen, {1: (50.0, E3)}).keys() == {1}


@given(
    st.dictionaries(
        st.integers(0, 8),
        st.dictionaries(
            st.one_of(st.none(), st.sampled_from([90.0, 95.0, 100.0, 105.0])), st.just(E1), min_size=1
        ),
        max_size=6,
    )
)
def test_aligned_windows_share_one_end(seen: dict[int, dict[float | None, Evidence]]) -> None:
    got = sl.aligned(seen)
    ends = [{e for e in by if e is not None} for by in seen.values()]
    ends = [e for e in ends if e]
    if got is None:
        assert ends and not set.intersection(*ends)
    else:
        assert got.keys() == seen.keys()


def test_the_judge_publishes_every_score_of_a_round_it_can_carry() -> None:
    assert sl.report_scores({2: 0.5, 0: 1.0}) == [sl.RankScore(0, 1.0), sl.RankScore(2, 0.5)]
    assert sl.report_scores({r: 1.0 for r in range(sl.MAX_TRACKED + 1)}) == []
    for bad in ((-1, 0.5), (0, 1.5), (0, float("nan"))):
        with pytest.raises(ValueError):
            sl.RankScore(*bad)
