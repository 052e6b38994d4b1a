"""Memory snapshots: the keeper's protocol and double buffer, frames, the bound, the submit check."""

from __future__ import annotations

import contextlib
import json
import mmap
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.errors import ErrorCode
from elasticd.jobs import snapshotspace
from elasticd.workers.snapshot_program import keeper as k
from elasticd.workers.snapshot_program.memory import agree
from elasticd.workers.snapshot_program.protocol import (
    HEADER,
    BadMessage,
    align,
    data_offset,
    header,
    parse_header,
    parse_reply,
    parse_request,
)
from elasticd.workers.warm.keeper import parse_ready


def req(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_requests_are_parsed_and_bounded() -> None:
    assert parse_request(req(op="list", name="/c.pt")) == {"op": "list", "name": "/c.pt"}
    begin = parse_request(req(op="begin", name="/c.pt", rank=3, step=7, size=100))
    assert begin == {"op": "begin", "name": "/c.pt", "rank": 3, "step": 7, "size": 100}
    assert parse_request(req(op="open", name="n", rank=0, slot=1, gen=4))["slot"] == 1
    for bad in (
        b"{",
        b"[]",
        req(op="fork", name="n"),
        req(op="list", name=""),
        req(op="list", name="x" * 2000),
        req(op="begin", name="n", rank=-1, step=0, size=1),
        req(op="begin", name="n", rank=0, step=0, size=True),
        req(op="commit", name="n", rank=0, slot=2, gen=1),
        b" " * (70 * 1024),
    ):
        with pytest.raises(BadMessage):
            parse_request(bad)


@given(st.binary(max_size=300))
def test_any_bytes_are_a_request_or_a_refusal(data: bytes) -> None:
    with contextlib.suppress(BadMessage):
        parse_request(data)


def test_deep_nesting_is_a_refusal_not_a_crash() -> None:
    with pytest.raises(BadMessage):
        parse_request(b"[" * 60000)
    with pytest.raises(ValueError):
        parse_ready(b"[" * 4000, 7)


def test_replies_and_headers() -> None:
    assert parse_reply(b'{"ok": true, "slot": 0}')["slot"] == 0
    for bad in (b"x", b'{"ok": 1}', b'{"ok": false}'):
        with pytest.raises(BadMessage):
            parse_reply(bad)
    meta = b"meta"
    assert parse_header(header(5, meta, 4096))[:3] == (5, 4, 4096)
    with pytest.raises(BadMessage):
        parse_header(b"NOTASNAP" + header(5, meta, 4096)[8:])
    with pytest.raises(BadMessage):
        parse_header(header(5, meta, 10))  # the data would start past the end
    assert data_offset(0) == align(HEADER.size) and data_offset(1) % 64 == 0


def slots(*states: tuple[str, int]) -> list[k.Slot]:
    pair = [k.Slot(), k.Slot()]
    for slot, (state, seq) in zip(pair, states, strict=True):
        slot.state, slot.seq = state, seq
    return pair


def test_a_snapshot_never_goes_to_the_newest_complete_slot() -> None:
    assert k.pick(slots((k.EMPTY, 0), (k.EMPTY, 0))) == 0
    assert k.pick(slots((k.COMPLETE, 1), (k.EMPTY, 0))) == 1
    assert k.pick(slots((k.WRITING, 0), (k.COMPLETE, 1))) == 0  # a crashed write is reused
    assert k.pick(slots((k.COMPLETE, 3), (k.COMPLETE, 2))) == 1
    assert k.pick(slots((k.COMPLETE, 2), (k.COMPLETE, 3))) == 0


def test_the_bound_counts_both_slots_of_every_rank() -> None:
    slot = k.Slot()
    assert k.over_bound(0, slot, 3 << 20, 8 << 20) is None
    why = k.over_bound(6 << 20, slot, 3 << 20, 8 << 20)
    assert why is not None and "snapshot_bytes" in why
    slot.capacity = 4 << 20
    assert k.over_bound(8 << 20, slot, 3 << 20, 8 << 20) is None  # fits the segment it has


def frame_bytes(keeper: k.Keeper, reply: dict[str, object], fd: int | None, step: int, body: bytes) -> None:
    assert fd is not None and reply["ok"]
    buf = mmap.mmap(fd, int(reply["capacity"]))  # type: ignore[call-overload]
    os.close(fd)
    meta = b"m" * 10
    start = align(HEADER.size)
    buf[start : start + len(meta)] = meta
    buf[data_offset(len(meta)) : data_offset(len(meta)) + len(body)] = body
    buf[0 : HEADER.size] = header(step, meta, data_offset(len(meta)) + len(body))
    buf.close()


def test_double_buffer_keeps_the_previous_snapshot_whole_through_a_torn_write() -> None:
    keeper = k.Keeper(64 << 20)
    for step in (1, 2):
        reply, fd = keeper.handle(parse_request(req(op="begin", name="c", rank=0, step=step, size=100)))
        frame_bytes(keeper, reply, fd, step, b"x" * 50)
        done, _ = keeper.handle(
            {"op": "commit", "name": "c", "rank": 0, "slot": reply["slot"], "gen": reply["gen"]}
        )
        assert done["ok"] and done["step"] == step
    # step 3 begins in step 1's slot and dies before its commit: steps 2 stays, 3 never shows
    reply, fd = keeper.handle({"op": "begin", "name": "c", "rank": 0, "step": 3, "size": 100})
    assert fd is not None
    os.close(fd)
    held, _ = keeper.handle({"op": "list", "name": "c"})
    assert [h["step"] for h in held["held"]] == [2]
    # a commit of a frame whose meta does not match is refused, and the slot is not complete
    reply, fd = keeper.handle({"op": "begin", "name": "c", "rank": 0, "step": 3, "size": 100})
    assert fd is not None
    os.pwrite(fd, header(3, b"other", 200), 0)
    os.close(fd)
    bad, _ = keeper.handle(
        {"op": "commit", "name": "c", "rank": 0, "slot": reply["slot"], "gen": reply["gen"]}
    )
    assert not bad["ok"] and "checksum" in bad["error"]
    opened, ro = keeper.handle({"op": "open", "name": "c", "rank": 0, "slot": 1 - reply["slot"], "gen": 2})
    assert opened["ok"] and opened["step"] == 2 and ro is not None
    with pytest.raises(OSError):
        os.pwrite(ro, b"x", 0)  # read-only: a restoring worker cannot spoil it
    os.close(ro)
    for pair in keeper.slots.values():
        for slot in pair:
            os.close(slot.fd)


def test_a_snapshot_over_the_bound_is_refused_with_the_setting() -> None:
    keeper = k.Keeper(4 << 20)
    reply, fd = keeper.handle({"op": "begin", "name": "c", "rank": 0, "step": 1, "size": 3 << 20})
    assert reply["ok"] and fd is not None
    os.close(fd)
    refused, none = keeper.handle({"op": "begin", "name": "c", "rank": 1, "step": 1, "size": 3 << 20})
    assert not refused["ok"] and "snapshot_bytes" in refused["error"] and none is None
    os.close(keeper.slots[("c", 0)][0].fd)


def test_ready_message_is_untrusted() -> None:
    assert parse_ready(b'{"ev": "ready", "pid": 7, "socket": "/tmp/d/sock"}', 7) == "/tmp/d/sock"
    for bad in (
        b'{"ev": "ready", "pid": 8, "socket": "/tmp/d/sock"}',
        b'{"ev": "ready", "pid": 7, "socket": "relative"}',
        b'{"ev": "ready", "pid": 7, "socket": "/' + b"x" * 200 + b'"}',
        b'{"ev": "unavailable", "reason": "no"}',
        b"[]",
        b"x" * 5000,
    ):
        with pytest.raises(ValueError):
            parse_ready(bad, 7)


def test_a_small_dev_shm_is_refused_with_its_code() -> None:
    assert snapshotspace.refusal(0, 64 << 20, "n1") is None
    assert snapshotspace.refusal(1 << 30, 2 << 30, "n1") is None
    small = snapshotspace.refusal(1 << 30, 64 << 20, "n1")
    assert small is not None and small.code is ErrorCode.SNAPSHOT_SPACE
    assert small.details == {"shm_bytes": 64 << 20, "bound": 1 << 30, "setting": "snapshot_bytes"}
    assert "--shm-size" in small.message
    assert snapshotspace.refusal(1, None, "n1") is not None
    assert snapshotspace.shm_bytes("/nonexistent") is None


class FakeDist:
    def __init__(self, others: list[object]) -> None:
        self.others = others

    def get_world_size(self) -> int:
        return len(self.others) + 1

    def all_gather_object(self, out: list[object], mine: object) -> None:
        out[:] = [mine, *self.others]


def test_every_rank_agrees_on_the_newest_step_all_hold() -> None:
    assert agree([3, 4], None) == 4
    assert agree([], None) is None
    assert agree([11, 12], FakeDist([[12, 13], [11, 12]])) == 12  # a rank one step ahead
    assert agree([11, 12], FakeDist([[]])) is None  # a rank lost its node: the disk
    assert agree([5], FakeDist(["junk"])) is None


def test_frames_round_trip() -> None:
    torch = pytest.importorskip("torch")
    from collections import OrderedDict

    from elasticd.workers.snapshot_program import frame

    state = {
        "step": 9,
        "model": OrderedDict(w=torch.randn(3, 4), b=torch.zeros(4, dtype=torch.float16)),
        "opt": {"state": {0: {"m": torch.arange(6).reshape(2, 3).t()}}, "lr": 0.1},  # not contiguous
        "flags": [torch.tensor(True), torch.empty(0), (1, "x")],
    }
    p = frame.plan(state)
    buf = bytearray(p.total)
    frame.write(p, 9, buf)
    step, back = frame.read(buf)
    assert step == 9 and back["opt"]["lr"] == 0.1 and back["flags"][2] == (1, "x")
    assert isinstance(back["model"], OrderedDict)
    assert torch.equal(back["model"]["w"], state["model"]["w"])
    assert back["model"]["b"].dtype == torch.float16
    assert torch.equal(back["opt"]["state"][0]["m"], state["opt"]["state"][0]["m"])
    assert back["flags"][0].item() is True and back["flags"][1].numel() == 0
    buf[align(HEADER.size)] ^= 0xFF  # a torn meta is refused
    with pytest.raises(BadMessage):
        frame.read(buf)
