"""The hang decider (pure, fake times) and py-spy's output as stacks."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.progress import stacks
from elasticd.progress.decider import (
    CPU_FRACTION,
    PEER_GRACE_S,
    STACK_LAG_S,
    CpuSample,
    Evidence,
    Hung,
    StackSample,
    decide,
    held_for_peers,
    judge,
    looks_stalled,
    root_cause,
)
from elasticd.progress.protocol import Phase

T = {p: 10.0 for p in Phase}


def flat(start: float, end: float, cpu: float = 5.0, every: float = 1.0) -> tuple[CpuSample, ...]:
    n = int((end - start) / every)
    return tuple(CpuSample(start + i * every, cpu) for i in range(n + 1))


def still(start: float, end: float, every: float = 2.0, digest: str = "d") -> tuple[StackSample, ...]:
    n = int((end - start) / every)
    return tuple(StackSample(start + i * every, digest, "x.py:3 in f") for i in range(n + 1))


def test_a_reporting_rank_hangs_when_its_last_report_is_older_than_the_timeout() -> None:
    ev = Evidence(2, Phase.STEP, last_report_at=100.0)
    assert judge(ev, T, 109.9) is None
    assert judge(ev, T, 110.0) == Hung(2, 100.0, 10.0, "", True)


def test_each_phase_has_its_timeout() -> None:
    timeouts = {Phase.STARTUP: 50.0, Phase.STEP: 10.0, Phase.CHECKPOINT: 100.0}
    assert judge(Evidence(0, Phase.CHECKPOINT, 0.0), timeouts, 60.0) is None
    assert judge(Evidence(0, Phase.STEP, 0.0), timeouts, 60.0) is not None


def test_a_silent_rank_with_flat_cpu_and_a_still_stack_hangs() -> None:
    ev = Evidence(1, Phase.STARTUP, None, cpu=flat(0, 12), stacks=still(2, 12))
    hung = judge(ev, T, 12.0)
    assert hung is not None and hung.frame == "x.py:3 in f" and not hung.reported and hung.since == 2.0


def test_cpu_use_means_progress() -> None:
    busy = tuple(CpuSample(float(t), 0.5 * t) for t in range(13))
    assert judge(Evidence(1, Phase.STARTUP, None, cpu=busy, stacks=still(0, 12)), T, 12.0) is None


def test_a_moving_stack_means_progress_even_without_cpu() -> None:
    moved = still(2, 6, digest="a") + still(8, 12, digest="b")
    assert judge(Evidence(1, Phase.STARTUP, None, cpu=flat(0, 12), stacks=moved), T, 12.0) is None


def test_too_short_evidence_is_not_enough() -> None:
    assert judge(Evidence(1, Phase.STARTUP, None, cpu=flat(5, 12), stacks=still(5, 12)), T, 12.0) is None
    assert judge(Evidence(1, Phase.STARTUP, None, cpu=flat(0, 12), stacks=still(11, 12)), T, 12.0) is None
    assert judge(Evidence(1, Phase.STARTUP, None, cpu=flat(0, 12), stacks=()), T, 12.0) is None


def test_without_stacks_cpu_decides_alone() -> None:
    ev = Evidence(1, Phase.STARTUP, None, cpu=flat(0, 12), stacks_available=False)
    assert judge(ev, T, 12.0) is not None


def test_decide_orders_by_silence_and_root_cause_prefers_a_rank_outside_collectives() -> None:
    evs = [Evidence(0, Phase.STEP, 5.0), Evidence(1, Phase.STEP, 3.0), Evidence(2, Phase.STEP, 20.0)]
    hung = decide(evs, T, 16.0)
    assert [h.rank for h in hung] == [1, 0]
    assert [h.rank for h in root_cause(hung, {1: True, 0: False})] == [0, 1]


def test_a_hang_whose_ranks_all_wait_on_others_is_held_for_the_peers_grace_once() -> None:
    hung = [Hung(0, 100.0, 10.0, "", True)]
    assert held_for_peers(hung, {0: True}, True, None, 110.0)  # the first tick holds it
    assert held_for_peers(hung, {0: True}, True, 110.0, 110.0 + PEER_GRACE_S - 0.01)
    assert not held_for_peers(hung, {0: True}, True, 110.0, 110.0 + PEER_GRACE_S)
    assert not held_for_peers(hung, {0: False}, True, None, 110.0)  # it is the culprit itself
    assert not held_for_peers(hung, {0: True}, False, None, 110.0)  # no other node to wait for
    two = [*hung, Hung(1, 101.0, 9.0, "", True)]
    assert not held_for_peers(two, {0: True, 1: False}, True, None, 110.0)


def _declared_at(since: float, waiting: bool, phase: float, timeout: float) -> float:
    """When a node's watch, ticking every 0.5 s from ``phase``, declares its one rank's hang."""
    held: float | None = None
    t = phase
    while True:
        t += 0.5
        hung = decide([Evidence(0, Phase.STEP, since)], dict.fromkeys(Phase, timeout), t)
        if not hung:
            continue
        if not held_for_peers(hung, {0: waiting}, True, held, t):
            return t
        held = t if held is None else held


@given(
    st.floats(0.0, 0.5, exclude_max=True),
    st.floats(0.0, 0.5, exclude_max=True),
    st.floats(0.05, 1.0),
    st.floats(1.0, 60.0),
)
def test_the_node_of_the_rank_that_stopped_declares_before_the_node_of_the_rank_waiting_on_it(
    phase_culprit: float, phase_waiter: float, lag: float, timeout: float
) -> None:
    """Two nodes tick on their own phases. The culprit went silent ``lag`` before its peer, which
    reached the next collective and waits there: the culprit's node writes the round's failure
    first, whatever the phases (the cross-node rule then keeps it: it went silent first)."""
    culprit = _declared_at(1000.0, False, phase_culprit, timeout)
    waiter = _declared_at(1000.0 + lag, True, phase_waiter, timeout)
    assert culprit < waiter


def test_looks_stalled() -> None:
    assert not looks_stalled(flat(0, 0.5))
    assert looks_stalled(flat(0, 2))
    assert not looks_stalled((CpuSample(0, 0), CpuSample(1, 0.5)))


times = st.floats(0.5, 300.0)


@given(times, st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40), st.floats(0.0, 0.999))
def test_no_hang_while_reports_arrive_within_the_timeout(
    timeout: float, gaps: list[float], at: float
) -> None:
    """Reports every < timeout apart: at no moment between them is the rank hung."""
    timeouts = {p: timeout for p in Phase}
    last = 0.0
    for gap in gaps:
        now = last + at * timeout  # some moment before the next report is due
        assert judge(Evidence(0, Phase.STEP, last), timeouts, now) is None
        last += gap * timeout * 0.999


@given(times, st.floats(0.0, 1e6), st.floats(0.0, 1e3))
def test_always_a_hang_once_silence_spans_the_timeout(timeout: float, last: float, extra: float) -> None:
    timeouts = {p: timeout for p in Phase}
    assert judge(Evidence(0, Phase.STEP, last), timeouts, last + timeout + extra) is not None


@given(st.floats(5.0, 120.0), st.floats(0.2, 2.0), st.floats(0.0, 30.0), st.floats(0.0, 1e4))
def test_flat_cpu_and_still_stacks_spanning_the_timeout_always_hang(
    timeout: float, every: float, extra: float, cpu: float
) -> None:
    end = timeout + every + extra
    ev = Evidence(
        0,
        Phase.STARTUP,
        None,
        cpu=flat(0.0, end, cpu, every),
        stacks=still(min(STACK_LAG_S, timeout) * 0.9, end, every),
    )
    now = ev.cpu[-1].at
    if now >= timeout and ev.stacks[-1].at - ev.stacks[0].at >= timeout - STACK_LAG_S:
        assert judge(ev, {p: timeout for p in Phase}, now) is not None


@given(st.floats(2.0, 120.0), st.lists(st.floats(0.1, 3.0), min_size=2, max_size=60), st.floats(0.0, 1.0))
def test_a_rank_that_keeps_using_cpu_never_hangs(timeout: float, gaps: list[float], extra: float) -> None:
    at, cpu, samples = 0.0, 0.0, []
    for gap in gaps:
        at += gap
        cpu += gap * (CPU_FRACTION + 0.01 + extra)  # more than the threshold, every interval
        samples.append(CpuSample(at, cpu))
    ev = Evidence(0, Phase.STARTUP, None, cpu=tuple(samples), stacks=still(0, at), stacks_available=False)
    assert judge(ev, {p: timeout for p in Phase}, at) is None


# -- py-spy's output -------------------------------------------------------------------------------
DUMP = [
    {
        "pid": 40, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": 40, "active": False,
        "owns_gil": False,
        "frames": [
            {"name": "all_reduce", "filename": "/v/torch/distributed/distributed_c10d.py", "line": 2800},
            {"name": "<module>", "filename": "/job/train.py", "line": 20},
        ],
    },
    {"thread_name": None, "os_thread_id": 41, "active": True,
     "frames": [{"name": "run", "filename": "t.py"}]},
]  # fmt: skip


def test_parse_a_dump() -> None:
    threads = stacks.parse_dump(json.dumps(DUMP).encode())
    main = stacks.main_thread(threads, 40)
    assert main is threads[0] and stacks.innermost(main) == "distributed_c10d.py:2800 in all_reduce"
    assert stacks.in_collective(main) and not stacks.in_collective(threads[1])
    assert stacks.digest(main) != stacks.digest(threads[1]) and len(stacks.digest(main)) == 16
    text = stacks.render(3, 40, threads)
    assert text.startswith("rank 3, process 40") and "(main thread)" in text
    assert "    <module> (/job/train.py:20)" in text
    assert stacks.main_thread(threads, 99) is threads[0]  # no thread with the pid: the first


@pytest.mark.parametrize(
    "doc",
    [b"nope", b"{}", b'[{"frames": 3}]', b'[{"frames": [7]}]', b'[{"frames": [{"name": 1}]}]',
     b'[{"frames": [{"line": "x"}]}]', b'[{"frames": [], "os_thread_id": "1"}]'],
)  # fmt: skip
def test_bad_dumps_are_errors_not_crashes(doc: bytes) -> None:
    with pytest.raises(stacks.StackError):
        stacks.parse_dump(doc)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    )
)
def test_any_json_parses_or_is_a_stack_error(doc: object) -> None:  # fmt: skip
    with contextlib.suppress(stacks.StackError):
        stacks.parse_dump(json.dumps(doc).encode())
