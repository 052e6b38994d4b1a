"""elasticd.terms.head: a job's head is bounded whatever its spec holds, decodes strictly, and a
full spec is taken only when it agrees with the head it was admitted by."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.decode import DecodeError
from elasticd.errors import InvalidSpec
from elasticd.terms.head import (
    ARGV_ITEM_CHARS,
    ARGV_ITEMS,
    CUT,
    MAX_HEAD_BYTES,
    JobHead,
    body_bytes,
    check_body,
    display_argv,
    parse_head,
)
from elasticd.terms.spec import MAX_ALLOWED_NODES, NodeRange
from tests.fakes import head_of, make_spec

TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=300)


def stored(head: JobHead) -> bytes:
    return json.dumps(head.to_json(), separators=(",", ":")).encode()  # as ``KV`` writes it


def test_a_head_is_what_every_daemon_needs_and_round_trips() -> None:
    spec = make_spec(env={"BIG": "x" * 50_000}, nodes=("n1", "n2"), priority=7, nnodes=NodeRange(1, 3))
    head = head_of(spec)
    assert (head.id, head.user, head.uid, head.gid, head.priority) == (spec.id, "u", 1000, 1000, 7)
    assert head.nodes == ("n1", "n2") and head.allows("n2") and not head.allows("n3")
    assert head.argv == tuple(spec.argv) and not head.argv_cut
    assert head.spec_bytes == len(body_bytes(spec)) > 50_000
    assert len(stored(head)) < 1024  # the environment stays in the full spec
    assert parse_head(stored(head)) == head


def test_argv_is_cut_for_display_and_says_so() -> None:
    assert display_argv(["a", "b"]) == (("a", "b"), False)
    long = "y" * (ARGV_ITEM_CHARS + 5)
    items, cut = display_argv([long])
    assert cut and len(items[0]) == ARGV_ITEM_CHARS and items[0].endswith(CUT)
    many = [str(i) for i in range(ARGV_ITEMS + 10)]
    items, cut = display_argv(many)
    assert cut and len(items) == ARGV_ITEMS and items[-1] == f"{CUT} (11 more)"
    assert items[:-1] == tuple(many[: ARGV_ITEMS - 1])


def test_the_largest_head_a_spec_can_make_fits_the_bound() -> None:
    nodes = tuple(f"{i:03d}" + "n" * 60 for i in range(MAX_ALLOWED_NODES))
    spec = make_spec(
        id="j" * 128,
        name="n" * 63,
        user="u" * 64,
        nodes=nodes,
        submitted_on="s" * 63,
        args=tuple("\u2603" * 1000 for _ in range(100)),  # escaped as \\uXXXX: 6 bytes a character
        entry="/" + "\u2603" * 1000,
    )
    raw = stored(head_of(spec))
    assert len(raw) <= MAX_HEAD_BYTES
    assert parse_head(raw).nodes == nodes


def test_a_spec_names_a_bounded_number_of_nodes() -> None:
    with pytest.raises(InvalidSpec, match=f"at most {MAX_ALLOWED_NODES}"):
        make_spec(nodes=tuple(f"n{i}" for i in range(MAX_ALLOWED_NODES + 1)))


def _head_json(**change: Any) -> dict[str, Any]:
    return head_of(make_spec()).to_json() | change


@pytest.mark.parametrize(
    "value",
    [
        b"{not json",
        json.dumps(_head_json(uid=-1)).encode(),
        json.dumps(_head_json(uid="0")).encode(),
        json.dumps(_head_json(user="../root")).encode(),
        json.dumps(_head_json(env={"A": "1"})).encode(),  # unknown fields are refused, as a spec's
        json.dumps(_head_json(argv=["x"] * (ARGV_ITEMS + 1))).encode(),
        json.dumps(_head_json(argv=["x" * (ARGV_ITEM_CHARS + 1)])).encode(),
        json.dumps(_head_json(nodes=["n"] * (MAX_ALLOWED_NODES + 1))).encode(),
        json.dumps(_head_json(spec_bytes=0)).encode(),
        json.dumps(_head_json(priority=10**6)).encode(),
        json.dumps({k: v for k, v in _head_json().items() if k != "nnodes"}).encode(),
        b'{"id": "' + b"x" * MAX_HEAD_BYTES + b'"}',  # refused by its size, before it is parsed
    ],
)
def test_a_bad_head_is_refused(value: bytes) -> None:
    with pytest.raises((DecodeError, InvalidSpec)):
        parse_head(value)


def test_a_full_spec_is_taken_only_when_it_agrees_with_its_head() -> None:
    spec = make_spec(env={"A": "1"})
    head = head_of(spec)
    assert check_body(head, body_bytes(spec)) == spec
    with pytest.raises(DecodeError, match="missing"):
        check_body(head, None)
    other = make_spec(env={"A": "2"})  # same size, another spec: agrees on every field of the head
    assert check_body(head_of(other), body_bytes(other)) == other
    bigger = make_spec(env={"A": "12"})
    with pytest.raises(DecodeError, match="spec_bytes"):
        check_body(head, body_bytes(bigger))
    for change, field in (({"uid": 0}, "uid"), ({"nodes": ("n1",)}, "nodes"), ({"priority": 9}, "priority")):
        rogue = make_spec(**change)
        head_sized = JobHead(**{**head_of(make_spec()).__dict__, "spec_bytes": len(body_bytes(rogue))})
        with pytest.raises(DecodeError, match=field):
            check_body(head_sized, body_bytes(rogue))
    not_a_spec = b'{"id":"x"}'
    with pytest.raises(DecodeError, match="malformed job spec"):
        check_body(JobHead(**{**head.__dict__, "spec_bytes": len(not_a_spec)}), not_a_spec)


@settings(max_examples=50, deadline=None)
@given(
    args=st.lists(TEXT, max_size=40),
    nodes=st.lists(st.from_regex(r"n[0-9]{1,3}", fullmatch=True), max_size=20),
)
def test_any_spec_makes_a_head_within_the_bound_that_its_body_agrees_with(
    args: list[str], nodes: list[str]
) -> None:
    spec = make_spec(args=tuple(args), nodes=tuple(nodes))
    head = head_of(spec)
    raw = stored(head)
    assert len(raw) <= MAX_HEAD_BYTES and parse_head(raw) == head
    assert head.argv_cut == (head.argv != tuple(spec.argv))
    assert check_body(head, body_bytes(spec)) == spec
