"""The pool of parked zygotes, decided purely: examples, and properties over random histories
(bounds always hold, nothing is ever adopted with any key difference, entries expire)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.workers.warm import pool_decider as pd
from elasticd.workers.warm.pool_decider import Adopt, Check, EntryState, Forget, Limits, Park, Pool, Stop, Why


@dataclass(frozen=True)
class K:
    """A key: the decider compares keys for equality and reads ``uid``."""

    uid: int
    env: str = "A=1"


LIMITS = Limits(size=2, keep_s=120.0, per_uid=1)


def parked(*specs: tuple[int, K, float]) -> Pool:
    pool = Pool()
    for entry, key, at in specs:
        pool, actions = pd.park(pool, entry, key, LIMITS, at, False)
        assert actions[-1] == Park(entry)
    return pool


def test_an_identical_job_adopts_after_a_fresh_check() -> None:
    pool = parked((1, K(1000), 0.0))
    pool, actions = pd.want(pool, K(1000), LIMITS, 10.0, False)
    assert actions == [Check(1)] and pool.entries[0].state is EntryState.CHECKING
    pool, actions = pd.checked(pool, 1, fresh=True)
    assert actions == [Adopt(1)] and pool.entries == ()


def test_a_stale_zygote_is_stopped_instead() -> None:
    pool, _ = pd.want(parked((1, K(1000), 0.0)), K(1000), LIMITS, 10.0, False)
    assert pd.checked(pool, 1, fresh=False) == (Pool(), [Stop(1, Why.STALE)])


def test_any_key_difference_adopts_nothing() -> None:
    pool = parked((1, K(1000), 0.0))
    for other in (K(1001), K(1000, "A=2")):
        assert pd.want(pool, other, LIMITS, 10.0, False) == (pool, [])


def test_the_most_recently_parked_of_equal_keys_is_checked() -> None:
    limits = Limits(size=3, keep_s=120.0, per_uid=3)
    pool = Pool()
    for entry, at in ((1, 0.0), (2, 5.0), (3, 2.0)):
        pool, _ = pd.park(pool, entry, K(7), limits, at, False)
    assert pd.want(pool, K(7), limits, 6.0, False)[1] == [Check(2)]


def test_one_per_user_the_newer_replaces_the_older() -> None:
    pool, actions = pd.park(parked((1, K(1000), 0.0)), 2, K(1000, "B=1"), LIMITS, 1.0, False)
    assert actions == [Stop(1, Why.EVICTED), Park(2)]
    assert [e.id for e in pool.entries] == [2]


def test_a_full_pool_evicts_the_least_recently_parked() -> None:
    pool = parked((1, K(1), 0.0), (2, K(2), 1.0))
    pool, actions = pd.park(pool, 3, K(3), LIMITS, 2.0, False)
    assert actions == [Stop(1, Why.EVICTED), Park(3)]
    assert sorted(e.id for e in pool.entries) == [2, 3]


def test_entries_being_checked_are_not_evicted() -> None:
    pool = parked((1, K(1), 0.0), (2, K(2), 1.0))
    pool, _ = pd.want(pool, K(1), LIMITS, 2.0, False)
    pool, _ = pd.want(pool, K(2), LIMITS, 2.0, False)
    assert pd.park(pool, 3, K(3), LIMITS, 3.0, False)[1] == [Stop(3, Why.FULL)]
    assert pd.park(pool, 4, K(1, "other"), LIMITS, 3.0, False)[1] == [Stop(4, Why.FULL)]


def test_entries_expire_after_keep_s() -> None:
    pool = parked((1, K(1), 0.0), (2, K(2), 50.0))
    assert pd.next_expiry(pool, LIMITS) == 120.0
    assert pd.expire(pool, LIMITS, 119.9) == (pool, [])
    pool, actions = pd.expire(pool, LIMITS, 120.0)
    assert actions == [Stop(1, Why.EXPIRED)] and pd.next_expiry(pool, LIMITS) == 170.0
    assert pd.want(pool, K(2), LIMITS, 170.0, False) == (Pool(), [Stop(2, Why.EXPIRED)])


def test_low_memory_parks_nothing_and_stops_what_is_parked() -> None:
    pool = parked((1, K(1), 0.0))
    assert pd.park(pool, 2, K(2), LIMITS, 1.0, True) == (
        Pool(),
        [Stop(1, Why.LOW_MEMORY), Stop(2, Why.LOW_MEMORY)],
    )
    pool = parked((1, K(1), 0.0), (2, K(2), 1.0))
    pool, actions = pd.want(pool, K(2), LIMITS, 2.0, True)
    assert actions == [Stop(1, Why.LOW_MEMORY), Check(2)]


def test_off_parks_nothing() -> None:
    for limits in (Limits(size=0), Limits(keep_s=0.0), Limits(per_uid=0)):
        assert pd.park(Pool(), 1, K(1), limits, 0.0, False) == (Pool(), [Stop(1, Why.OFF)])


def test_a_lost_entry_is_forgotten_and_its_check_ignored() -> None:
    pool, _ = pd.want(parked((1, K(1), 0.0)), K(1), LIMITS, 1.0, False)
    pool, actions = pd.lost(pool, 1)
    assert actions == [Forget(1, Why.LOST)] and pool == Pool()
    assert pd.checked(pool, 1, fresh=True) == (pool, [])
    assert pd.lost(pool, 1) == (pool, [])


def test_close_stops_every_entry() -> None:
    pool, _ = pd.want(parked((1, K(1), 0.0), (2, K(2), 1.0)), K(1), LIMITS, 2.0, False)
    assert pd.close(pool) == (Pool(), [Stop(1, Why.CLOSED), Stop(2, Why.CLOSED)])


# --- properties over random histories ---------------------------------------------------------------

keys = st.builds(K, st.integers(0, 3), st.sampled_from(["A=1", "A=2"]))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("park"), keys, st.booleans()),
        st.tuples(st.just("want"), keys, st.booleans()),
        st.tuples(st.just("checked"), st.integers(0, 10), st.booleans()),
        st.tuples(st.just("lost"), st.integers(0, 10), st.booleans()),
        st.tuples(st.just("expire"), st.just(None), st.booleans()),
    ),
    max_size=40,
)
limits_st = st.builds(Limits, st.integers(0, 4), st.sampled_from([0.0, 5.0, 30.0]), st.integers(0, 2))


@settings(max_examples=400, deadline=None)
@given(limits_st, ops, st.lists(st.floats(0, 20), min_size=40, max_size=40))
def test_bounds_hold_and_nothing_is_adopted_across_keys(
    limits: Limits, history: list[tuple[str, object, bool]], steps: list[float]
) -> None:
    pool, now, next_id = Pool(), 0.0, 1
    asked: dict[int, K] = {}  # entry -> the key of the want that checked it
    keys_of: dict[int, K] = {}
    for (op, arg, low), step in zip(history, steps, strict=False):
        now += step
        if op == "park":
            assert isinstance(arg, K)
            entry, next_id = next_id, next_id + 1
            keys_of[entry] = arg
            pool, actions = pd.park(pool, entry, arg, limits, now, low)
            assert (Park(entry) in actions) == (not limits.off and not low and pool.get(entry) is not None)
        elif op == "want":
            assert isinstance(arg, K)
            pool, actions = pd.want(pool, arg, limits, now, low)
            for action in actions:
                if isinstance(action, Check):
                    assert keys_of[action.id] == arg, "checked an entry of another key"
                    asked[action.id] = arg
        elif op == "checked":
            assert isinstance(arg, int)
            pool, actions = pd.checked(pool, arg, fresh=low)
            for action in actions:
                if isinstance(action, Adopt):
                    assert asked[action.id] == keys_of[action.id], "adopted across keys"
        elif op == "lost":
            assert isinstance(arg, int)
            pool, actions = pd.lost(pool, arg)
        else:
            pool, actions = pd.expire(pool, limits, now)
        ids = [e.id for e in pool.entries]
        assert len(ids) == len(set(ids))
        assert len(ids) <= max(limits.size, 0)
        for uid in {e.uid for e in pool.entries}:
            assert sum(e.uid == uid for e in pool.entries) <= limits.per_uid
        assert all(keys_of[e.id] == e.key for e in pool.entries)
        if op in ("park", "want", "expire"):  # every decision that is given ``now`` expires first
            assert all(
                now - e.parked_at < limits.keep_s for e in pool.entries if e.state is EntryState.PARKED
            )
        gone = {a.id for a in actions if isinstance(a, Stop | Forget | Adopt)}
        assert not gone & set(ids), "an entry acted on as gone is still in the pool"
