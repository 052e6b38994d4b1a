"""etcd near its quota: the level decider, the reading that keeps it, the refusal of submits, and
the janitor's relief (ended jobs removed before their retention, oldest first), on MemoryKV."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.errors import ErrorCode, EtcdFull
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.space import MIB, Ended, Space, SpaceLevel, SpaceLimits, decide, excess, relief
from elasticd.etcd.types import EtcdStatus
from elasticd.history.model import ClusterEvent
from elasticd.history.store import EventLog
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.facts import NodeFacts
from elasticd.manager.janitor import RELIEF_S, Janitor
from elasticd.manager.service import CommandService
from elasticd.rendezvous.jobparse import parse_jobs
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.state import EndReason, JobState
from tests.fakes import make_spec

pytestmark = pytest.mark.timeout(30)
KEYS = Keys("/x")
LIMITS = SpaceLimits(100 * MIB, 0.8)  # the mark: 80 MiB; left below 75 MiB


def status(size_mib: float, in_use_mib: float | None = None, alarms: tuple[str, ...] = ()) -> EtcdStatus:
    in_use = size_mib if in_use_mib is None else in_use_mib
    return EtcdStatus(int(size_mib * MIB), int(in_use * MIB), 10, alarms)


# -- the decider ----------------------------------------------------------------------------------
def test_levels_by_size_with_hysteresis_and_alarms() -> None:
    ok, high, full, unknown = SpaceLevel.OK, SpaceLevel.HIGH, SpaceLevel.FULL, SpaceLevel.UNKNOWN
    assert decide(status(10), LIMITS, unknown) is ok
    assert decide(status(81), LIMITS, ok) is high
    assert decide(status(78), LIMITS, ok) is ok  # below the mark, coming from OK
    assert decide(status(78), LIMITS, high) is high  # ... but from HIGH: not yet below 75 MiB
    assert decide(status(74), LIMITS, high) is ok
    assert decide(status(10, alarms=("NOSPACE",)), LIMITS, ok) is full  # the alarm stays until disarmed
    assert decide(status(10, alarms=("CORRUPT",)), LIMITS, ok) is full
    assert decide(status(78), LIMITS, full) is ok  # disarmed: by size again, as from the start
    assert decide(None, LIMITS, high) is unknown  # etcd would not say


@given(
    sizes=st.lists(st.floats(0, 120), min_size=1, max_size=30),
    alarmed=st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_the_level_refuses_above_the_mark_and_admits_below_the_low_mark(
    sizes: list[float], alarmed: list[bool]
) -> None:
    level = SpaceLevel.UNKNOWN
    for size, alarm in zip(sizes, alarmed, strict=False):
        level = decide(status(size, alarms=("NOSPACE",) if alarm else ()), LIMITS, level)
        refuses = Space(level, None, LIMITS).refuses_submits
        if alarm or size * MIB > LIMITS.mark:
            assert refuses
        if not alarm and size * MIB <= LIMITS.low_mark:
            assert not refuses


def test_the_refusal_says_the_size_the_quota_the_setting_and_what_to_do() -> None:
    high = Space(SpaceLevel.HIGH, status(85, 60), LIMITS).message()
    for text in ("85.0 MiB", "60.0 MiB in use", "100.0 MiB", "etcd_high_water=0.8", "etcd_quota_bytes="):
        assert text in high
    for step in ("etcdctl compact", "etcdctl defrag", "etcdctl alarm disarm", "running jobs go on"):
        assert step in high
    full = Space(SpaceLevel.FULL, status(100, alarms=("NOSPACE",)), LIMITS).message()
    assert "NOSPACE alarm" in full and "alarm disarm" in full
    corrupt = Space(SpaceLevel.FULL, status(10, alarms=("CORRUPT",)), LIMITS).message()
    assert "CORRUPT" in corrupt and "snapshot" in corrupt


def test_relief_takes_the_oldest_ended_jobs_until_the_excess_is_covered() -> None:
    ended = [Ended(f"j{i}", 100.0 - i, 2 * MIB) for i in range(10)]  # j9 ended first
    space = Space(SpaceLevel.HIGH, status(90, 80), LIMITS)  # 5 MiB in use above the low mark
    assert excess(space) == 5 * MIB
    assert relief(space, ended) == ["j9", "j8", "j7"]
    assert relief(Space(SpaceLevel.OK, status(70), LIMITS), ended) == []
    assert relief(Space(SpaceLevel.HIGH, status(90, 40), LIMITS), ended) == []  # only a defrag helps
    assert relief(Space(SpaceLevel.HIGH, status(200), LIMITS), ended) == [f"j{i}" for i in range(9, -1, -1)]


# -- the reading and the refusal -------------------------------------------------------------------
def test_the_watch_keeps_the_level_and_a_failed_read_keeps_the_last() -> None:
    kv = MemoryKV()
    watch = SpaceWatch(kv, LIMITS, clock=lambda: 5.0)
    watch.check_submit()  # not read yet: unknown, nothing refused
    kv.db_size, kv.db_size_in_use = 90 * MIB, 85 * MIB
    assert asyncio.run(watch.read()).level is SpaceLevel.HIGH and watch.space.read_at == 5.0
    with pytest.raises(EtcdFull) as exc:
        watch.check_submit()
    assert exc.value.code is ErrorCode.ETCD_FULL and exc.value.details["db_size"] == 90 * MIB
    kv.fail_next()
    assert asyncio.run(watch.read()).level is SpaceLevel.HIGH
    kv.db_size = kv.db_size_in_use = 10 * MIB
    assert asyncio.run(watch.read()).level is SpaceLevel.OK
    watch.check_submit()


def test_submit_is_refused_first_while_etcd_is_full() -> None:
    kv = MemoryKV()
    kv.alarms.add("NOSPACE")
    watch = SpaceWatch(kv, LIMITS)
    asyncio.run(watch.read())
    facts = NodeFacts("n1", 0.0, (), True, False, 10.0, Path("/nonexistent"))
    service = CommandService(facts, None, None, kv, KEYS, space=watch)  # type: ignore[arg-type]  # refused first
    with pytest.raises(EtcdFull, match="NOSPACE"):
        asyncio.run(service.jobs.submit(make_spec()))
    space = service.nodes.etcd_space()
    assert space is not None and space.to_json()["alarms"] == ["NOSPACE"]


# -- the janitor's relief --------------------------------------------------------------------------
def _ended_jobs(kv: MemoryKV, n: int) -> None:
    for i in range(n):
        store = InlineJobStore(kv, KEYS, f"old-{i}")
        run_inline(store.create(make_spec(id=f"old-{i}")))
        run_inline(store.finalize(JobState.SUCCEEDED, EndReason.SUCCEEDED, ""))


def test_under_pressure_the_janitor_removes_the_oldest_ended_jobs_and_compacts_even_under_nospace() -> None:
    kv = MemoryKV()
    _ended_jobs(kv, 6)
    run_inline(InlineJobStore(kv, KEYS, "live-1").create(make_spec(id="live-1")))
    events = EventLog(kv, KEYS)
    events.append(ClusterEvent(1e9, "succeeded", "old-0"))
    now = [1000.0]
    space = [Space(SpaceLevel.OK, status(10), LIMITS)]
    janitor = Janitor(kv, KEYS, "n1", lambda job: InlineJobStore(kv, KEYS, job), retention_s=None,
                      clock=lambda: now[0], space=lambda: space[0])  # fmt: skip

    def reads() -> dict[str, JobRead]:
        return parse_jobs(KEYS, kv.get_prefix("/x/"))[0]

    assert asyncio.run(janitor.relieve(reads())) == set()  # OK: nothing before its retention
    kv.alarms.add("NOSPACE")  # etcd refuses what grows it: deletes and compaction still go
    space[0] = Space(SpaceLevel.FULL, status(100, 75 + 6 / 1024), LIMITS)  # 6 KiB above the low mark
    removed = asyncio.run(janitor.relieve(reads()))
    assert removed == {"old-0", "old-1"}  # the oldest ended first; a job weighs 4-5 KiB here
    left = reads()
    assert "old-0" not in left and "old-2" in left and "live-1" in left
    assert events.read(job="old-0").events == []  # its events went with it
    assert kv._compacted == kv.status().revision  # type: ignore[union-attr]  # compacted to the current
    assert asyncio.run(janitor.relieve(reads())) == set()  # not again before RELIEF_S
    now[0] += RELIEF_S
    assert asyncio.run(janitor.relieve(reads())) == {"old-2", "old-3"}
    assert "live-1" in reads()  # a job that has not ended is never removed
