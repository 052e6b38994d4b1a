"""The informer's store (``elasticd.informer.store``), pure: a list replaces the copy, a watch's
changes are applied in order (none the last list showed), a group's read is made once per change
and handed out as the same object, and the copy is bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.etcd.types import KeyValue, WatchEvent
from elasticd.informer.store import Bound, Completeness, Store

HELD = [("h/", "h0")]


UNBOUNDED = Bound()


def store(bound: Bound = UNBOUNDED) -> Store[tuple[bytes, ...]]:
    return Store(HELD, lambda key: key.split("/")[1], lambda group, kvs: tuple(kv.value for kv in kvs), bound)


def state(s: Store[tuple[bytes, ...]]) -> Completeness:
    return s.state  # (read anew: a call may have changed it)


def kv(key: str, value: bytes, revision: int) -> KeyValue:
    return KeyValue(key, value, revision, revision, 0)


def put(key: str, value: bytes, revision: int) -> WatchEvent:
    return WatchEvent(kv(key, value, revision), deleted=False)


def delete(key: str, revision: int) -> WatchEvent:
    return WatchEvent(KeyValue(key, b"", 0, revision, 0), deleted=True)


def test_a_list_then_changes_and_the_same_objects_while_nothing_changed() -> None:
    s = store()
    assert s.replace([kv("h/a/1", b"x", 3), kv("h/b/1", b"y", 4)], 5) == {"a", "b"}
    first = s.reads()
    assert first == {"a": (b"x",), "b": (b"y",)} and s.reads() is first and s.revision == 5
    assert s.apply([put("h/a/2", b"z", 6), put("elsewhere", b"w", 7)]) == {"a"}
    again = s.reads()
    assert again == {"a": (b"x", b"z"), "b": (b"y",)} and again["b"] is first["b"]
    assert s.revision == 7 and s.get("elsewhere") is None  # a watch's progress, not held
    s.apply([delete("h/b/1", 8)])
    assert s.reads() == {"a": (b"x", b"z")} and s.decoded == 3


def test_changes_the_last_list_showed_and_an_older_list_are_not_applied() -> None:
    s = store()
    s.replace([kv("h/a/1", b"new", 9)], 10)
    s.apply([put("h/a/1", b"old", 4), delete("h/a/1", 10)])  # (at or before the list)
    assert s.reads() == {"a": (b"new",)}
    assert s.replace([kv("h/a/1", b"older", 2)], 8) == set()  # a late list
    assert s.reads() == {"a": (b"new",)} and s.revision == 10


def test_past_the_bound_new_keys_are_left_out_and_held_ones_still_change() -> None:
    s = store(Bound(keys=2, bytes=1000))
    s.replace([kv("h/a/1", b"x", 1), kv("h/b/1", b"y", 1), kv("h/c/1", b"z", 1)], 1)
    assert len(s) == 2 and s.state is Completeness.OVER_BOUND and s.left_out == 1
    s.apply([put("h/a/1", b"x2", 2), put("h/d/1", b"w", 3)])
    assert s.reads() == {"a": (b"x2",), "b": (b"y",)} and s.left_out == 2
    s.replace([kv("h/a/1", b"x2", 2)], 4)  # a list that fits
    assert state(s) is Completeness.WHOLE and s.left_out == 0
    small = store(Bound(keys=10, bytes=12))
    small.replace([kv("h/a/1", b"12345", 1), kv("h/b/1", b"12345", 1)], 1)
    assert len(small) == 1 and small.size == 10 and small.state is Completeness.OVER_BOUND


OPS = st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("12"), st.booleans()), max_size=30)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, cut=st.integers(0, 30))
def test_a_list_then_the_changes_after_it_is_every_key_as_of_the_last(
    ops: list[tuple[str, str, bool]], cut: int
) -> None:
    """Wherever the list falls among the changes, the copy ends as the keys do."""
    now: dict[str, KeyValue] = {}
    events: list[WatchEvent] = []
    for revision, (group, leaf, deleted) in enumerate(ops, 2):
        key = f"h/{group}/{leaf}"
        if deleted:
            now.pop(key, None)
            events.append(delete(key, revision))
        else:
            now[key] = kv(key, str(revision).encode(), revision)
            events.append(put(key, str(revision).encode(), revision))
        if revision - 1 == cut:
            listed, at = dict(now), revision
    if cut == 0 or cut > len(ops):
        listed, at = {}, 1
    s = store()
    s.replace(listed.values(), at)
    s.apply(events)  # (a watch from before the list: the store skips what the list showed)
    want: dict[str, tuple[bytes, ...]] = {}
    for key in sorted(now):
        want[key.split("/")[1]] = (*want.get(key.split("/")[1], ()), now[key].value)
    assert s.reads() == want
