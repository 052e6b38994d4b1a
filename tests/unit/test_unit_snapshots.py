"""Memory snapshots: the keeper's protocol and double buffer, frames, the bound, the submit check."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from elasticd.errors import ErrorCode
from elasticd.jobs import snapshotspace
from elasticd.node import hostmemory
from elasticd.workers.snapshot_program import keeper as k
from elasticd.workers.snapshot_program import restore as nearest
from elasticd.workers.snapshot_program.protocol import (
    HEADER,
    BadMessage,
    align,
    data_offset,
    header,
    parse_header,
)
from elasticd.workers.snapshot_program.replies import (
    Begun,
    Committed,
    Held,
    KeyKnown,
    Listed,
    Opened,
    Refused,
    Reply,
)
from elasticd.workers.snapshot_program.requests import Begin, Commit, Key, ListHeld, Open, Peer, Put
from elasticd.workers.warm.snapshotkeeper import parse_ready


def test_a_ready_message_nested_deep_is_a_refusal_not_a_crash() -> None:
    with pytest.raises(ValueError):
        parse_ready(b"[" * 4000, 7)


def test_headers() -> None:
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


def frame_bytes(keeper: k.Keeper, reply: Reply, fd: int | None, step: int, body: bytes) -> None:
    assert fd is not None and isinstance(reply, Begun)
    buf = mmap.mmap(fd, reply.capacity)
    os.close(fd)
    meta = b"m" * 10
    start = align(HEADER.size)
    buf[start : start + len(meta)] = meta
    buf[data_offset(len(meta)) : data_offset(len(meta)) + len(body)] = body
    buf[0 : HEADER.size] = header(step, meta, data_offset(len(meta)) + len(body))
    buf.close()


def begun(got: tuple[Reply, int | None]) -> tuple[Begun, int]:
    reply, fd = got
    assert isinstance(reply, Begun) and fd is not None, reply
    return reply, fd


def listed(keeper: k.Keeper, name: str = "c") -> tuple[Held, ...]:
    reply, _ = keeper.handle(ListHeld(name))
    assert isinstance(reply, Listed)
    return reply.held


def test_double_buffer_keeps_the_previous_snapshot_whole_through_a_torn_write() -> None:
    keeper = k.Keeper(64 << 20)
    for step in (1, 2):
        reply, fd = begun(keeper.handle(Begin("c", 0, step, 100)))
        frame_bytes(keeper, reply, fd, step, b"x" * 50)
        done, _ = keeper.handle(Commit("c", 0, reply.slot, reply.gen))
        assert isinstance(done, Committed) and done.step == step
    # step 3 begins in step 1's slot and dies before its commit: steps 2 stays, 3 never shows
    reply, fd = begun(keeper.handle(Begin("c", 0, 3, 100)))
    os.close(fd)
    assert [h.step for h in listed(keeper)] == [2]
    # a commit of a frame whose meta does not match is refused, and the slot is not complete
    reply, fd = begun(keeper.handle(Begin("c", 0, 3, 100)))
    os.pwrite(fd, header(3, b"other", 200), 0)
    os.close(fd)
    bad, _ = keeper.handle(Commit("c", 0, reply.slot, reply.gen))
    assert isinstance(bad, Refused) and "checksum" in bad.error
    opened, ro = keeper.handle(Open("c", 0, 1 - reply.slot, 2))
    assert isinstance(opened, Opened) and opened.step == 2 and ro is not None
    with pytest.raises(OSError):
        os.pwrite(ro, b"x", 0)  # read-only: a restoring worker cannot spoil it
    os.close(ro)
    for pair in keeper.slots.values():
        for slot in pair:
            os.close(slot.fd)


def test_a_snapshot_over_the_bound_is_refused_with_the_setting() -> None:
    keeper = k.Keeper(4 << 20)
    _, fd = begun(keeper.handle(Begin("c", 0, 1, 3 << 20)))
    os.close(fd)
    refused, none = keeper.handle(Begin("c", 1, 1, 3 << 20))
    assert isinstance(refused, Refused) and "snapshot_bytes" in refused.error and none is None
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
    assert hostmemory.shm_bytes("/nonexistent") is None


def report(rank: int, held: list[list[int]], key: str | None = None, port: int = 0) -> dict[str, object]:
    address = "10.0.0.1" if port else ""
    return {"rank": rank, "key": key, "proposal": f"p{rank}", "address": address, "port": port, "held": held}


def test_every_rank_picks_the_same_key_ring_and_step() -> None:
    assert nearest.choose_key([report(1, []), report(0, [])]) == "p0"
    assert nearest.choose_key([report(0, []), report(1, [], key="k1"), report(2, [], key="k2")]) == "k1"
    a, b, c = 7001, 7002, 7003
    reports = [report(0, [], port=a), report(1, [], port=a), report(2, [], port=b), report(3, [], port=c)]
    assert [nearest.ring_peer(reports, r) for r in range(4)] == [
        ("10.0.0.1", b), ("10.0.0.1", b), ("10.0.0.1", c), ("10.0.0.1", a),
    ]  # fmt: skip
    assert nearest.ring_peer(reports[:2], 0) is None  # one node: no peer
    assert nearest.ring_peer([report(0, [])], 0) is None  # no link


def test_a_rank_loads_the_newest_step_from_the_nearest_copy() -> None:
    mine = [Held(0, 0, 1, 12, 100), Held(1, 1, 2, 12, 100, replica=True), Held(0, 1, 3, 11, 100)]
    reports = [report(0, [[0, 12], [1, 12], [0, 11]], port=1), report(1, [[1, 11]], port=2)]
    # rank 1's node lost its newest: it loads step 12 from node 1's keeper, its own rank's replica first
    found = nearest.sources(reports, [Held(1, 0, 1, 11, 100)], 1)
    assert [(s.step, s.rank, s.peer) for s in found] == [(12, 1, ("10.0.0.1", 1)), (12, 0, ("10.0.0.1", 1))]
    # rank 0 loads its own, from its own keeper
    assert nearest.sources(reports, mine, 0)[0].held == mine[0]
    assert nearest.sources([report(0, []), report(1, [])], [], 0) == []
    assert nearest.sources([report(0, [[0, 3]]), {"junk": 1}], [Held(0, 0, 1, 3, 10)], 0)[0].step == 3


def test_frames_round_trip() -> None:
    torch = pytest.importorskip("torch")
    from collections import OrderedDict

    from elasticd.workers.snapshot_program import frame

    state: dict[str, Any] = {
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


def test_keepers_replicate_to_their_peer_and_refuse_other_keys() -> None:
    import socket
    import time

    from elasticd.workers.snapshot_program import peers, replica

    keepers = []
    for _ in range(2):
        tcp = socket.create_server(("127.0.0.1", 0))
        keeper = k.Keeper(64 << 20, "127.0.0.1", tcp.getsockname()[1])
        peers.start(keeper, tcp)
        keepers.append(keeper)
    a, b = keepers
    key = "ab" * 32
    for keeper in keepers:
        assert keeper.handle(Key(key))[0] == KeyKnown(key, "127.0.0.1", keeper.port)
    a.handle(Peer("127.0.0.1", b.port))
    reply, fd = begun(a.handle(Begin("c", 0, 4, 100)))
    frame_bytes(a, reply, fd, 4, b"y" * 60)
    assert isinstance(a.handle(Commit("c", 0, reply.slot, reply.gen))[0], Committed)
    deadline = time.monotonic() + 10
    while not (held := listed(b)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held == (Held(0, 0, 1, 4, held[0].length, replica=True),)
    got = replica.fetch(("127.0.0.1", b.port), bytes.fromhex(key), "c", 0, 4)
    assert parse_header(bytes(got[: HEADER.size]))[0] == 4 and b"y" * 60 in got
    with pytest.raises(ConnectionError):  # another job's key: the link closes before anything is sent
        replica.fetch(("127.0.0.1", b.port), bytes.fromhex("cd" * 32), "c", 0, 4)
    with pytest.raises(BadMessage):
        replica.fetch(("127.0.0.1", b.port), bytes.fromhex(key), "c", 0, 5)  # not held
    # a put signed with another key never becomes a replica
    with replica.connect(("127.0.0.1", b.port)) as sock:
        replica.send_head(sock, bytes.fromhex("cd" * 32), Put("c", 1, 9, 10, replica.nonce()))
        assert sock.recv(1) == b""  # closed on the head
    assert [h.rank for h in listed(b)] == [0]


def test_a_pinned_slot_is_never_written_again_and_let_go_once_replaced_twice() -> None:
    keeper = k.Keeper(64 << 20)

    def snap(step: int) -> int:
        reply, fd = begun(keeper.handle(Begin("c", 0, step, 100)))
        frame_bytes(keeper, reply, fd, step, b"z")
        assert isinstance(keeper.handle(Commit("c", 0, reply.slot, reply.gen))[0], Committed)
        return reply.slot

    first = snap(1)
    second = snap(2)
    _, ro = keeper.handle(Open("c", 0, second, 2, pin=True))
    assert ro is not None
    os.close(ro)
    pinned_fd = keeper.slots[("c", 0)][second].fd
    assert snap(3) == first  # the older one is reused; the pinned newest is not
    third = snap(4)
    assert third == 2 and len(keeper.slots[("c", 0)]) == 3  # a third segment rather than the pinned one
    # two newer snapshots replaced the pinned one: its segment is let go, not reused
    assert keeper.slots[("c", 0)][second].state == k.EMPTY and keeper.slots[("c", 0)][second].fd == -1
    with pytest.raises(OSError):
        os.fstat(pinned_fd)
    assert [h.step for h in listed(keeper)] == [3, 4]
    for slot in keeper.slots[("c", 0)]:
        if slot.fd >= 0:
            os.close(slot.fd)


def test_a_peer_that_trickles_its_head_loses_the_link(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from elasticd.workers.snapshot_program import peers, replica

    monkeypatch.setattr(replica, "IO_TIMEOUT_S", 0.3)
    tcp = socket.create_server(("127.0.0.1", 0))
    keeper = k.Keeper(64 << 20, "127.0.0.1", tcp.getsockname()[1])
    keeper.handle(Key("ab" * 32))
    peers.start(keeper, tcp)
    with socket.create_connection(("127.0.0.1", keeper.port), timeout=5) as slow:
        slow.sendall(b"\x00\x00")  # half a length, then nothing
        assert slow.recv(1) == b""  # closed after the head's deadline, not held
    with pytest.raises(BadMessage):  # and the server serves the next link
        replica.fetch(("127.0.0.1", keeper.port), bytes.fromhex("ab" * 32), "c", 0, 1)


def test_a_killed_keepers_directory_is_swept_by_the_next_keeper(tmp_path: Path) -> None:
    import socket
    import time

    from elasticd.workers.snapshot_program import main

    old = time.time() - 120
    dead = tmp_path / f"{main.PREFIX}dead"
    dead.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.bind(str(dead / "sock"))  # bound, never listening again: its keeper is gone
    live = tmp_path / f"{main.PREFIX}live"
    live.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(live / "sock"))
    listener.listen(1)
    young = tmp_path / f"{main.PREFIX}young"  # maybe a keeper about to bind: left alone
    young.mkdir(mode=0o700)
    other = tmp_path / "unrelated"
    other.mkdir()
    for d in (dead, live, other):
        os.utime(d, (old, old))
    try:
        assert main.sweep_stale(str(tmp_path)) == 1
        assert not dead.exists() and live.exists() and young.exists() and other.exists()
    finally:
        listener.close()


class _Dist:
    """torch.distributed as a rank sees it: ``barrier`` counted (a real one would wait for ranks
    that, snapshotting to memory, never come)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.barriers = rank, 0

    def get_rank(self) -> int:
        return self.rank

    def barrier(self) -> None:
        self.barriers += 1


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_whose_keeper_fails_writes_without_waiting_for_ranks_in_memory(
    rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from elasticd import worker
    from elasticd.workers.snapshot_program import collective, memory, protocol

    dist = _Dist(rank)
    monkeypatch.setattr(collective, "group", lambda: dist)
    monkeypatch.setattr(memory, "save", lambda *_: False)  # e.g. its keeper died
    monkeypatch.setenv(protocol.SOCKET_ENV, str(tmp_path / "gone.sock"))
    worker.save_checkpoint({"step": 3}, tmp_path / "ckpt.pt")
    assert dist.barriers == 0
    assert (tmp_path / "ckpt.pt").exists() == (rank == 0)  # the writer rank wrote it, alone
    monkeypatch.delenv(protocol.SOCKET_ENV)  # no snapshots in this job: every rank waits, as always
    worker.save_checkpoint({"step": 4}, tmp_path / "ckpt.pt")
    assert dist.barriers == 1
