"""Hypothesis strategies shared by the property tests of untrusted input."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st


def json_values(max_leaves: int = 25, max_text: int = 20, max_items: int = 4) -> st.SearchStrategy[Any]:
    """Any JSON value (floats include NaN and infinities, which ``json.dumps`` writes anyway)."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=max_text),
        lambda children: (
            st.lists(children, max_size=max_items)
            | st.dictionaries(st.text(max_size=8), children, max_size=max_items)
        ),
        max_leaves=max_leaves,
    )


def stored_values(max_bytes: int = 80, **json_sizes: int) -> st.SearchStrategy[bytes]:
    """What a hostile writer can put under an etcd key: random bytes, or random JSON."""
    return st.binary(max_size=max_bytes) | json_values(**json_sizes).map(lambda v: json.dumps(v).encode())
