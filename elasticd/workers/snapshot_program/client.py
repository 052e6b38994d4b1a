"""A worker's connection to its job's snapshot keeper on this node (``keeper``).

``save`` asks for a segment (``begin``), copies the state's frame into it and commits it; it keeps
each segment mapped, so from the second snapshot on a save is one request, the copy, one request.
``held`` lists the complete snapshots of a name; ``load`` maps one read-only and copies it out.
Any failure of the keeper (gone, refused, out of its bound) raises ``SnapshotError``: the caller
falls back to a disk checkpoint.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
import threading
from typing import Any

from elasticd.workers.snapshot_program import frame
from elasticd.workers.snapshot_program.protocol import MAX_MESSAGE, BadMessage
from elasticd.workers.snapshot_program.replies import (
    Answer,
    Begun,
    Claimed,
    Committed,
    Done,
    Held,
    KeyKnown,
    Listed,
    Opened,
    Refused,
    parse_reply,
)
from elasticd.workers.snapshot_program.requests import (
    Begin,
    Claim,
    Commit,
    Key,
    ListHeld,
    Local,
    Open,
    Peer,
    Written,
    encode_message,
)

TIMEOUT_S = 30.0


class SnapshotError(Exception):
    """The keeper could not take or give a snapshot (the reason is the message)."""


class KeeperClient:
    def __init__(self, path: str) -> None:
        self._path = path
        self._sock: socket.socket | None = None
        self._maps: dict[tuple[str, int, int], tuple[int, mmap.mmap]] = {}  # (name, rank, slot) -> gen, map
        self._pinned: set[int] = set()  # ids of the mappings registered with CUDA
        self._lock = threading.Lock()  # one request at a time (a persist thread may ask too)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.settimeout(TIMEOUT_S)
            try:
                sock.connect(self._path)
            except OSError as exc:
                sock.close()
                raise SnapshotError(f"cannot reach the snapshot keeper at {self._path}: {exc}") from exc
            self._sock = sock
        return self._sock

    def call(self, req: Local, expect: type[Answer]) -> tuple[Answer, int | None]:
        """One request and its reply, an ``expect``, with the fd it carried (the caller owns it)."""
        with self._lock:
            sock = self._connect()
            try:
                sock.send(encode_message(req))
                data, anc, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4))
            except OSError as exc:
                self.close()
                raise SnapshotError(f"snapshot keeper: {exc}") from exc
        fd = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(payload) >= 4:
                fd = struct.unpack("i", payload[:4])[0]
        try:
            reply = parse_reply(data, expect)
        except BadMessage as exc:
            if fd is not None:
                os.close(fd)
            raise SnapshotError(f"snapshot keeper: {exc}") from exc
        if isinstance(reply, Refused):
            if fd is not None:
                os.close(fd)
            raise SnapshotError(reply.error)
        return reply, fd

    def save(self, state: Any, name: str, rank: int, step: int, file: bool = False) -> int:
        """Snapshot ``state`` as ``step``; returns its slot once the copy is committed. ``file``:
        this rank writes the file ``name`` (the keeper writes it too when the workers fail, with
        the ``elasticd`` this worker imported: its directory goes along)."""
        p = frame.plan(state)
        lib = (
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(frame.__file__)))) if file else ""
        )
        begun, fd = self.call(Begin(name, rank, step, p.total, file, lib), Begun)
        slot, gen = begun.slot, begun.gen
        buf = self._mapping(name, rank, slot, gen, begun.capacity, fd)
        if id(buf) not in self._pinned and frame.on_device(p):
            from elasticd.workers.snapshot_program import device

            if device.register(buf):
                self._pinned.add(id(buf))
        frame.write(p, step, buf)
        self.call(Commit(name, rank, slot, gen), Committed)
        return slot

    def mapped(self, name: str, rank: int, slot: int) -> mmap.mmap | None:
        """This worker's own mapping of a segment it wrote (for a background persist)."""
        held = self._maps.get((name, rank, slot))
        return held[1] if held is not None else None

    def _mapping(self, name: str, rank: int, slot: int, gen: int, capacity: int, fd: int | None) -> mmap.mmap:
        if fd is None:
            raise SnapshotError("snapshot keeper: no segment came with its reply")
        key = (name, rank, slot)
        try:
            held = self._maps.get(key)
            if held is not None and held[0] == gen:
                return held[1]
            if held is not None:
                self._unmap(held[1])
            buf = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        self._maps[key] = (gen, buf)
        return buf

    def _unmap(self, buf: mmap.mmap) -> None:
        if id(buf) in self._pinned:
            from elasticd.workers.snapshot_program import device

            self._pinned.discard(id(buf))
            device.unregister(buf)
        with contextlib.suppress(BufferError):  # a tensor still views it: it goes with the last view
            buf.close()

    def held(self, name: str) -> list[Held]:
        listed, _ = self.call(ListHeld(name), Listed)
        return list(listed.held)

    def load(self, name: str, held: Held) -> tuple[int, Any]:
        """``(step, state)`` of a held snapshot. Its tensors are views of a private (copy-on-write)
        mapping of the keeper's segment, which the keeper pins: it never writes that segment again,
        so the pages stay shared until the training loop writes them, and a restore copies nothing
        (``load_state_dict``'s copy reads them once)."""
        opened, fd = self.open(name, held, pin=True)
        try:
            buf = mmap.mmap(fd, opened.length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            return frame.read(buf, views=True)
        except (BadMessage, ValueError) as exc:
            self._unmap(buf)
            raise SnapshotError(f"snapshot of step {held.step}: {exc}") from exc

    def open(self, name: str, held: Held, pin: bool = False) -> tuple[Opened, int]:
        """The keeper's reply and a read-only fd of the segment of ``held`` (``pin``: the keeper
        never writes that segment again)."""
        opened, fd = self.call(Open(name, held.rank, held.slot, held.gen, held.replica, pin), Opened)
        if fd is None:
            raise SnapshotError("snapshot keeper: no segment came with its reply")
        return opened, fd

    def key(self, key: str | None = None) -> tuple[str | None, str, int]:
        """Set the job's key (given) and read it back: ``(key, address, port)`` of the keeper's
        replication link (port 0: it has none)."""
        known, _ = self.call(Key(key), KeyKnown)
        return known.key, known.address, known.port

    def peer(self, address: str | None, port: int) -> None:
        """Replicate this node's snapshots to the keeper at ``address:port`` (None: to none)."""
        self.call(Peer(address, port), Done)

    def claim(self, name: str, step: int) -> tuple[str, int | None]:
        """Whether to write ``step`` to the file ``name`` now (``filing.claim``): ``write``,
        ``skip``, or ``wait`` with an fd that reaches EOF when the keeper's own write ends."""
        claimed, fd = self.call(Claim(name, step), Claimed)
        return claimed.do, fd

    def written(self, name: str, step: int) -> None:
        """``step`` is in the file ``name`` now."""
        self.call(Written(name, step), Done)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
