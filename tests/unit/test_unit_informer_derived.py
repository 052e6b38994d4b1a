"""``Derived`` (``informer/derived.py``): a value made from the copy is made again only when the
copy changed or what else it reads differs; a value per group only for a group whose read is
another object; and what it gives is what making it afresh gives, whatever came before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.etcd.types import KeyValue, WatchEvent
from elasticd.informer.derived import Derived
from elasticd.informer.store import Store


class Read:
    """A group's read: a new object per change, as the store hands them out."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_a_value_is_made_once_per_state_and_inputs() -> None:
    state: dict[str, Read] = {}
    derived = Derived(lambda: state)
    made: list[int] = []

    def total() -> int:
        made.append(1)
        return sum(r.value for r in state.values())

    assert derived.value("total", total) == 0
    assert derived.value("total", total) == 0 and len(made) == 1  # the same state: kept
    state = {"a": Read(2)}
    assert derived.value("total", total) == 2 and len(made) == 2  # another state
    assert derived.value("total", total, inputs=1) == 2 and len(made) == 3  # other inputs
    assert derived.value("total", total, inputs=1) == 2 and len(made) == 3
    state["b"] = Read(5)  # (a state is never changed in place: this one is not seen)
    assert derived.value("total", total, inputs=1) == 2


def test_values_are_bounded_the_least_recently_used_dropped_first() -> None:
    state = object()
    derived = Derived(lambda: state, bound=2)
    made: list[str] = []

    def make(key: str) -> str:
        made.append(key)
        return key

    derived.value("a", lambda: make("a"))
    derived.value("b", lambda: make("b"))
    derived.value("a", lambda: make("a"))  # a: used last
    derived.value("c", lambda: make("c"))  # b goes
    derived.value("a", lambda: make("a"))
    derived.value("b", lambda: make("b"))
    assert made == ["a", "b", "c", "b"]


IDS = ["g0", "g1", "g2", "g3", "g4"]
# One step: a group gone (None), or given another read (True) or kept (False), and its input.
steps = st.lists(
    st.tuples(st.sampled_from(IDS), st.one_of(st.none(), st.booleans()), st.integers(0, 2)), max_size=25
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_each_after_any_reads_is_each_of_the_last_reads_alone(
    changes: list[tuple[str, bool | None, int]],
) -> None:
    reads: dict[str, Read] = {}
    inputs: dict[str, int] = {}
    derived = Derived(lambda: reads)
    for n, (group, changed, given_) in enumerate(changes):
        was = (reads.get(group), inputs.get(group))
        reads = dict(reads)  # a new read of every group
        if changed is None:
            reads.pop(group, None)
        elif changed or group not in reads:
            reads[group] = Read(n)
        inputs = inputs | {group: given_}
        made: list[str] = []

        def make(g: str, r: Read, made: list[str] = made, inputs: dict[str, int] = inputs) -> tuple[int, int]:
            made.append(g)
            return (r.value, inputs[g])

        assert derived.each("each", reads, make, inputs) == {
            g: (r.value, inputs[g]) for g, r in reads.items()
        }
        # Made again: only the group whose read is another object, or whose input changed.
        again = group in reads and (reads[group], given_) != was
        assert made == ([group] if again else [])


def test_a_store_hands_out_values_made_again_only_after_a_change() -> None:
    s: Store[tuple[bytes, ...]] = Store(
        [("h/", "h0")], lambda key: key.split("/")[1], lambda group, kvs: tuple(kv.value for kv in kvs)
    )
    s.replace([KeyValue("h/x/1", b"one", 2, 2, 0), KeyValue("h/y/1", b"two", 3, 3, 0)], 3)
    derived = Derived(s.reads)
    made: list[str] = []

    def first(group: str, read: tuple[bytes, ...]) -> bytes:
        made.append(group)
        return read[0]

    assert derived.each("first", s.reads(), first) == {"x": b"one", "y": b"two"}
    assert derived.value("n", lambda: len(s.reads())) == 2
    s.apply([WatchEvent(KeyValue("h/x/1", b"uno", 2, 4, 0), deleted=False)])
    assert derived.each("first", s.reads(), first) == {"x": b"uno", "y": b"two"}
    assert sorted(made) == ["x", "x", "y"]  # y's read is the same object: its value kept
    assert derived.value("n", lambda: -1) == -1  # the copy changed: made again
