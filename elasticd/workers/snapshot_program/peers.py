"""The keeper's replication: a server for other keepers' puts and workers' gets, and a pusher
that sends each new complete snapshot to the peer (standard library only; part of the keeper's
program, after ``requests``, ``replica`` and ``keeper``).

Both are threads of the keeper; they take ``Keeper.lock`` to look slots up and never while they
copy. A frame is read from a segment the worker may write again (two snapshots later): the
sender compares the slot's ``begun`` count after the copy and, when it moved, sends no valid tag,
so a torn frame is never taken. The server handles one link at a time, each receive and send
bounded by ``IO_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import hmac
import mmap
import os
import socket
import threading
from typing import Any

if __name__ != "__elasticd_keeper__":
    from elasticd.workers.snapshot_program.keeper import COMPLETE, EMPTY, Keeper, Slot
    from elasticd.workers.snapshot_program.replica import (
        CHUNK,
        IO_TIMEOUT_S,
        TAG,
        connect,
        nonce,
        recv_exact,
        recv_head,
        recv_into,
        send_head,
    )
    from elasticd.workers.snapshot_program.replies import Refused, Sending
    from elasticd.workers.snapshot_program.requests import Get, Put, parse_transfer


def _stream(sock: socket.socket, fd: int, length: int, mac: Any) -> None:
    if not length:
        return
    with mmap.mmap(fd, length, prot=mmap.PROT_READ) as buf, memoryview(buf) as view:
        for at in range(0, length, CHUNK):
            with view[at : at + CHUNK] as part:
                mac.update(part)
                sock.sendall(part)


def _unchanged(keeper: Keeper, slot: Slot, gen: int, begun: int) -> bool:
    with keeper.lock:
        return slot.gen == gen and slot.begun == begun and slot.state == COMPLETE


def _pin(keeper: Keeper, slot: Slot) -> tuple[int, int, int, int]:
    """Under the lock: what to send and how to tell it changed: ``(fd, length, gen, begun)``."""
    return os.dup(slot.fd), slot.length, slot.gen, slot.begun


class Server:
    """Puts from the peer keepers, gets from the job's workers (``replica``)."""

    def __init__(self, keeper: Keeper, listener: socket.socket) -> None:
        self.keeper = keeper
        self.listener = listener

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(IO_TIMEOUT_S)
                with contextlib.suppress(Exception):  # a bad or broken link costs that link only
                    self.serve(conn)

    def serve(self, conn: socket.socket) -> None:
        with self.keeper.lock:
            key = self.keeper.key
        raw = recv_head(conn, key)
        assert key is not None  # recv_head refuses every head without one
        match parse_transfer(raw):
            case Put() as put:
                self._put(conn, key, put, raw)
            case Get() as get:
                self._get(conn, key, get)

    def _put(self, conn: socket.socket, key: bytes, req: Put, raw: bytes) -> None:
        got = self.keeper.begin_replica(req.name, req.rank, req.step, req.length)
        if isinstance(got, str):
            conn.sendall(b"\x01")
            return
        slot, gen, fd = got
        try:
            buf = mmap.mmap(fd, slot.capacity) if req.length else None
        finally:
            os.close(fd)
        try:
            mac = hmac.new(key, digestmod="sha256")
            mac.update(raw)
            if buf is not None:
                with memoryview(buf) as view, view[: req.length] as part:
                    recv_into(conn, part, mac)
            if not hmac.compare_digest(recv_exact(conn, TAG), mac.digest()):
                with self.keeper.lock:
                    slot.state = EMPTY
                conn.sendall(b"\x01")
                return
        finally:
            if buf is not None:
                buf.close()
        conn.sendall(b"\x00" if self.keeper.commit_replica(slot, gen) is None else b"\x01")

    def _get(self, conn: socket.socket, key: bytes, req: Get) -> None:
        with self.keeper.lock:
            slot = self.keeper.find(req.name, req.rank, req.step)
            pinned = _pin(self.keeper, slot) if slot is not None else None
        if slot is None or pinned is None:
            send_head(conn, key, Refused("not held"))
            return
        fd, length, gen, begun = pinned
        try:
            head = send_head(conn, key, Sending(length))
            mac = hmac.new(key, digestmod="sha256")
            mac.update(req.nonce.encode())
            mac.update(head)
            _stream(conn, fd, length, mac)
        finally:
            os.close(fd)
        conn.sendall(mac.digest() if _unchanged(self.keeper, slot, gen, begun) else bytes(TAG))


class Pusher:
    """Sends each (name, rank)'s newest complete snapshot to the peer, the newest only."""

    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper

    def run(self) -> None:
        keeper = self.keeper
        while True:
            with keeper.wake:
                while not (keeper.pushes and keeper.peer is not None and keeper.key is not None):
                    keeper.wake.wait()
                (name, rank), index = keeper.pushes.popitem()
                slot = keeper.slots[(name, rank)][index]
                if slot.state != COMPLETE:
                    continue
                peer, key, step = keeper.peer, keeper.key, slot.step
                fd, length, gen, begun = _pin(keeper, slot)
            try:
                self.push(peer, key, name, rank, step, fd, length, (slot, gen, begun))
            except Exception:  # the peer is away or failed: the next snapshot tries again
                pass
            finally:
                os.close(fd)

    def push(
        self, peer: tuple[str, int], key: bytes, name: str, rank: int, step: int, fd: int, length: int,
        pinned: tuple[Slot, int, int],
    ) -> None:  # fmt: skip
        with connect(peer) as sock:
            head = send_head(sock, key, Put(name, rank, step, length, nonce()))
            mac = hmac.new(key, digestmod="sha256")
            mac.update(head)
            _stream(sock, fd, length, mac)
            sock.sendall(mac.digest() if _unchanged(self.keeper, *pinned) else bytes(TAG))
            recv_exact(sock, 1)


def start(keeper: Keeper, listener: socket.socket) -> None:
    for target in (Server(keeper, listener).run, Pusher(keeper).run):
        threading.Thread(target=target, daemon=True).start()
