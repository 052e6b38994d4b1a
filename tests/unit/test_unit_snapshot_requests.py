"""The snapshot keeper's typed messages (``snapshot_program.requests`` and ``replies``): every
kind round-trips through the one encoder and its parser, the JSON on the wire is what the keeper
has always read, and anything else (malformed, oversized, wrong-typed, another socket's kind) is a
``BadMessage``, never another exception."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.workers.snapshot_program.protocol import (
    MAX_GEN,
    MAX_HELD,
    MAX_LENGTH,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_RANK,
    MAX_SIZE,
    MAX_SLOT,
    MAX_STEP,
    BadMessage,
)
from elasticd.workers.snapshot_program.replies import (
    SKIP,
    WAIT,
    WRITE,
    Begun,
    Claimed,
    Committed,
    Done,
    Held,
    KeyKnown,
    Listed,
    Opened,
    Refused,
    Reply,
    Sending,
    parse_reply,
)
from elasticd.workers.snapshot_program.requests import (
    LINK,
    LOCAL,
    MAX_HEAD,
    Begin,
    Claim,
    Commit,
    Get,
    Key,
    Link,
    ListHeld,
    Local,
    Op,
    Open,
    Peer,
    Put,
    Written,
    encode_message,
    parse_request,
    parse_transfer,
)

ANSWERS = (Done, Begun, Committed, Listed, Opened, KeyKnown, Claimed, Sending)


def wire(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(encode_message(msg))
    return out


def data(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# --- strategies: every valid message -----------------------------------------------------------------

names = st.text(min_size=1, max_size=40).filter(lambda n: "\0" not in n)
ranks = st.integers(0, MAX_RANK)
steps = st.integers(0, MAX_STEP)
slots = st.integers(0, MAX_SLOT)
gens = st.integers(0, MAX_GEN)
sizes = st.integers(0, MAX_SIZE)
keys = st.one_of(st.none(), st.binary(min_size=32, max_size=32).map(bytes.hex))
nonces = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
addresses = st.one_of(
    st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str)
)  # as ``ipaddress`` writes them
peers = st.one_of(st.just(Peer(None, 0)), st.builds(Peer, addresses, st.integers(1, 65535)))

locals_: st.SearchStrategy[Local] = st.one_of(
    st.builds(Begin, names, ranks, steps, sizes, st.booleans(), names | st.just("")),
    st.builds(Commit, names, ranks, slots, gens),
    st.builds(ListHeld, names),
    st.builds(Open, names, ranks, slots, gens, st.booleans(), st.booleans()),
    st.builds(Key, keys),
    peers,
    st.builds(Claim, names, steps),
    st.builds(Written, names, steps),
)
links: st.SearchStrategy[Link] = st.one_of(
    st.builds(Put, names, ranks, steps, st.integers(0, MAX_LENGTH), nonces),
    st.builds(Get, names, ranks, steps, nonces),
)
helds = st.builds(Held, ranks, slots, gens, steps, sizes, st.booleans())
answers: st.SearchStrategy[Reply] = st.one_of(
    st.just(Done()),
    st.builds(Begun, slots, gens, sizes),
    st.builds(Committed, steps, st.integers(0, MAX_HELD)),
    st.builds(Listed, st.lists(helds, max_size=5).map(tuple)),
    st.builds(Opened, sizes, steps),
    st.builds(KeyKnown, keys, st.text(max_size=40), st.integers(0, 65535)),
    st.builds(Claimed, st.sampled_from((WRITE, SKIP, WAIT))),
    st.builds(Sending, st.integers(0, MAX_LENGTH)),
)


@given(locals_)
def test_every_request_of_a_worker_round_trips(req: Local) -> None:
    assert parse_request(encode_message(req)) == req


@given(links)
def test_every_head_of_the_replication_link_round_trips(req: Link) -> None:
    assert parse_transfer(encode_message(req)) == req


@given(answers)
def test_every_reply_round_trips(reply: Reply) -> None:
    assert parse_reply(encode_message(reply), type(reply)) == reply  # type: ignore[type-var]


@given(st.text(max_size=300), st.sampled_from(ANSWERS))
def test_a_refusal_round_trips_whatever_was_asked(error: str, expect: Any) -> None:
    assert parse_reply(encode_message(Refused(error)), expect) == Refused(error)


def test_every_op_has_one_kind_on_one_socket() -> None:
    assert set(LOCAL) | set(LINK) == set(Op) and not set(LOCAL) & set(LINK)
    assert all(kind.OP is op for op, kind in [*LOCAL.items(), *LINK.items()])


def test_the_wire_keeps_the_keepers_field_names() -> None:
    assert wire(Begin("/c.pt", 3, 7, 100, True, "/lib")) == {
        "op": "begin", "name": "/c.pt", "rank": 3, "step": 7, "size": 100, "file": True, "lib": "/lib",
    }  # fmt: skip
    assert wire(Open("n", 0, 1, 4, pin=True)) == {
        "op": "open", "name": "n", "rank": 0, "slot": 1, "gen": 4, "replica": False, "pin": True,
    }  # fmt: skip
    assert wire(Peer(None, 0)) == {"op": "peer", "address": None, "port": 0}
    assert wire(Put("c", 1, 9, 10, "0" * 32)) == {
        "op": "put", "name": "c", "rank": 1, "step": 9, "length": 10, "nonce": "0" * 32,
    }  # fmt: skip
    assert wire(Listed((Held(0, 1, 2, 3, 4, True),))) == {
        "ok": True, "held": [{"rank": 0, "slot": 1, "gen": 2, "step": 3, "length": 4, "replica": True}],
    }  # fmt: skip
    assert wire(Begun(0, 1, 2)) == {"ok": True, "slot": 0, "gen": 1, "capacity": 2}
    assert wire(Done()) == {"ok": True}
    assert wire(Refused("no")) == {"ok": False, "error": "no"}


def test_what_older_workers_send_is_read_as_before() -> None:
    assert parse_request(data(op="list", name="/c.pt")) == ListHeld("/c.pt")
    begin = parse_request(data(op="begin", name="/c.pt", rank=3, step=7, size=100, file=True))
    assert begin == Begin("/c.pt", 3, 7, 100, file=True, lib="")
    assert parse_request(data(op="open", name="n", rank=0, slot=1, gen=4)) == Open("n", 0, 1, 4)
    assert parse_request(data(op="key")) == Key(None)
    assert parse_request(data(op="peer", address=None, port="ignored")) == Peer(None, 0)
    assert parse_request(data(op="peer", address="::ffff:10.0.0.1", port=80)) == Peer("::ffff:a00:1", 80)
    assert parse_request(data(op="claim", name="n", step=3, extra=[1])) == Claim("n", 3)


@pytest.mark.parametrize(
    "bad",
    [
        b"{",
        b"[]",
        b'"op"',
        b"[" * 60000,
        b" " * (MAX_MESSAGE + 1),
        data(name="n"),
        data(op="fork", name="n"),
        data(op=["list"], name="n"),
        data(op="put", name="c", rank=1, step=9, length=10, nonce="0" * 32),  # the link's, not this socket's
        data(op="list", name=""),
        data(op="list", name="x" * (MAX_NAME + 1)),
        data(op="list", name="a\0b"),
        data(op="list", name=7),
        data(op="begin", name="n", rank=-1, step=0, size=1),
        data(op="begin", name="n", rank=MAX_RANK + 1, step=0, size=1),
        data(op="begin", name="n", rank=0, step=0, size=True),
        data(op="begin", name="n", rank=0, step=0, size=1.0),
        data(op="begin", name="n", rank=0, step=0, size=MAX_SIZE + 1),
        data(op="begin", name="n", rank=0, step=MAX_STEP + 1, size=1),
        data(op="begin", name="n", rank=0, step="1", size=1),
        data(op="begin", name="n", rank=0, step=0, size=1, lib=3),
        data(op="begin", name="n", rank=0, step=0, size=1, lib=None),
        data(op="commit", name="n", rank=0, slot=MAX_SLOT + 1, gen=1),
        data(op="commit", name="n", rank=0, slot=0, gen=MAX_GEN + 1),
        data(op="commit", name="n", rank=0, slot=0),
        data(op="open", name="n", rank=0, slot=0, gen=[1]),
        data(op="key", key="ab"),
        data(op="key", key="zz" * 32),
        data(op="key", key=" a" * 32),  # 64 characters, fewer bytes
        data(op="key", key=7),
        data(op="peer", address="not an address", port=80),
        data(op="peer", address=167772161, port=80),  # an address is text
        data(op="peer", address="10.0.0.1", port=0),
        data(op="peer", address="10.0.0.1", port=65536),
        data(op="peer", address="10.0.0.1", port="80"),
        data(op="claim", name="n"),
        data(op="written", name="n", step=-1),
    ],
)
def test_malformed_oversized_and_wrong_typed_requests_are_refused(bad: bytes) -> None:
    with pytest.raises(BadMessage):
        parse_request(bad)


@pytest.mark.parametrize(
    "bad",
    [
        b" " * (MAX_HEAD + 1),
        b"[]",
        data(op="list", name="c"),  # the worker's socket's, not the link's
        data(op="put", name="c", rank=1, step=9, length=MAX_LENGTH + 1, nonce="0" * 32),
        data(op="put", name="c", rank=1, step=9, nonce="0" * 32),
        data(op="get", name="c", rank=1, step=9, nonce="0" * 31),
        data(op="get", name="c", rank=1, step=9, nonce=None),
        data(op="get", name="", rank=1, step=9, nonce="0" * 32),
    ],
)
def test_bad_heads_of_the_replication_link_are_refused(bad: bytes) -> None:
    with pytest.raises(BadMessage):
        parse_transfer(bad)


@pytest.mark.parametrize(
    ("bad", "expect"),
    [
        (b"x", Done),
        (b'{"ok": 1}', Done),
        (b'{"ok": false}', Done),
        (b'{"ok": false, "error": 3}', Done),
        (data(ok=True, slot=0, gen=1), Begun),
        (data(ok=True, slot="0", gen=1, capacity=2), Begun),
        (data(ok=True, held=[{"rank": 0}]), Listed),
        (data(ok=True, held=[1]), Listed),
        (data(ok=True, held={}), Listed),
        (data(ok=True, key=5, address="", port=0), KeyKnown),
        (data(ok=True, key=None, address="", port="0"), KeyKnown),
        (data(ok=True, do="maybe"), Claimed),
        (data(ok=True, do=["write"]), Claimed),
        (data(ok=True, length=MAX_LENGTH + 1), Sending),
    ],
)
def test_bad_replies_are_refused(bad: bytes, expect: Any) -> None:
    with pytest.raises(BadMessage):
        parse_reply(bad, expect)


NOT_INT: tuple[Any, ...] = ("1", 1.5, True, None, [], {}, -1)
NOT_TEXT: tuple[Any, ...] = (1, 1.5, True, None, [], {})
TEXTS = {"name", "lib", "nonce"}


@given(locals_ | links, st.data())
def test_a_field_of_the_wrong_type_is_refused(req: Local | Link, draw: st.DataObject) -> None:
    fields = {f.name for f in dataclasses.fields(req)} - {"file", "replica", "pin"}  # flags: true, or not
    if isinstance(req, Key | Peer):
        return  # None is a key to read and a peer to drop: their checks are listed above
    field = draw.draw(st.sampled_from(sorted(fields)))
    value = draw.draw(st.sampled_from(NOT_TEXT if field in TEXTS else NOT_INT))
    sent = wire(req) | {field: value}
    with pytest.raises(BadMessage):
        (parse_transfer if isinstance(req, Put | Get) else parse_request)(json.dumps(sent).encode())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = ("op", "ok", "error", "name", "rank", "step", "size", "slot", "gen", "key", "address", "port",
          "lib", "file", "length", "nonce", "held", "do", "capacity")  # fmt: skip
objects = st.dictionaries(
    st.sampled_from(FIELDS), json_values | st.sampled_from([o.value for o in Op]), max_size=8
)


@given(json_values | objects, st.sampled_from(ANSWERS))
def test_arbitrary_json_is_a_message_or_a_bad_message(value: Any, expect: Any) -> None:
    raw = json.dumps(value).encode()
    for parse in (parse_request, parse_transfer, lambda b: parse_reply(b, expect)):
        with contextlib.suppress(BadMessage):
            parse(raw)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_a_message_or_a_bad_message(raw: bytes) -> None:
    for parse in (parse_request, parse_transfer, lambda b: parse_reply(b, Listed)):
        with contextlib.suppress(BadMessage):
            parse(raw)
