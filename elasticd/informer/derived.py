"""``Derived``: values made from the copy, each made again only when what it was made from changed.

What is computed from every group's read (a queue of every job, a reply listing every job) costs
what the groups are, and is asked for far more often than the copy changes. The store hands out
the same mapping of reads while nothing changed, and a group's same read while its keys did not
(``store.py``). So:

- a value made from the copy (``value``) is kept while the mapping is the same object, and while
  what else it reads (``inputs``: an admission count, this node's part in its jobs; compared with
  ``==``) is equal;
- a value made per group (``each``) is made again only for a group whose read is another object,
  or whose own entry of ``inputs`` differs: after one change, one group's value, not one per group.

A value is named by a key, which also holds whatever selects it among its kind (a reply's
filter). The values of the copy as it is now are kept, ``bound`` keys at most (the least recently
used dropped first); a change of the copy drops them all. Whoever reads a value cannot tell
whether it was made for them. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar, cast

R = TypeVar("R")
V = TypeVar("V")

MAX_VALUES = 64  # values kept for the copy as it is: a few kinds, and a reply per filter


class Derived:
    """The values made from the copy that ``state`` returns (module doc); its identity says
    whether the copy changed. Used on one event loop."""

    def __init__(self, state: Callable[[], object], bound: int = MAX_VALUES) -> None:
        if bound <= 0:
            raise ValueError("a bound must be positive")
        self._state = state
        self._bound = bound
        self._of: object = None  # the state the values were made from
        self._values: dict[Hashable, tuple[object, object]] = {}  # key → (inputs, value)
        # Per key of ``each``: each group's read, its entry of the inputs, and its value. Kept
        # across changes of the copy: that is what spares a group whose read did not change.
        self._groups: dict[Hashable, dict[str, tuple[object, object, object]]] = {}

    def value(self, key: Hashable, make: Callable[[], V], inputs: object = None) -> V:
        """``make()``, as made for the copy as it is and ``inputs`` (made now if it was not)."""
        state = self._state()
        if state is not self._of:
            self._of, self._values = state, {}
        values = self._values
        held = values.pop(key, None)
        if held is None or held[0] != inputs:
            held = (inputs, make())  # (it may make other values: the same state's)
            if len(values) >= self._bound:
                del values[next(iter(values))]
        values[key] = held  # (the most recently used last)
        return cast(V, held[1])

    def each(
        self,
        key: Hashable,
        reads: Mapping[str, R],
        make: Callable[[str, R], V],
        inputs: Mapping[str, object] | None = None,
    ) -> dict[str, V]:
        """``{group: make(group, read)}`` for every group of ``reads``, each made again only when its
        read is another object than the last one given under ``key``, or its entry of ``inputs``
        (what else ``make`` reads of that group) differs."""
        inputs = inputs or {}
        kept = self._groups.get(key, {})
        made: dict[str, tuple[object, object, object]] = {}
        for group, read in reads.items():
            held, given = kept.get(group), inputs.get(group)
            if held is None or held[0] is not read or held[1] != given:
                held = (read, given, make(group, read))
            made[group] = held
        self._groups[key] = made  # (groups gone are dropped)
        return {group: cast(V, held[2]) for group, held in made.items()}
