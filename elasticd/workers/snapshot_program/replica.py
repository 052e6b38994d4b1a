"""Keeper to keeper, and worker to keeper, over the workers' network: replicas of snapshots
(standard library only; part of the keeper's program, after ``protocol``, ``replies`` and ``requests``).

Every exchange is authenticated with the job's key (HMAC-SHA256): 32 random bytes that the job's
ranks agree on in ``load_checkpoint`` and hand to their keepers over the keepers' private UNIX
sockets, so only the job's own processes hold it; another job, or another local user, can neither
write nor read a replica. The link is not encrypted (as gloo's is not): it carries the same
tensors the collectives do.

Messages: a JSON head (at most ``MAX_HEAD`` bytes, its length first as 4 bytes) and its tag, so a
peer without the key is refused before it can make the keeper allocate anything; for a ``put``,
then ``length`` bytes of the frame and a tag over head and frame; for a ``get``, the reply's head,
the frame and a tag over the request's nonce, the reply's head and the frame. Everything received
is untrusted: heads are parsed and bounded (``requests.parse_transfer``), lengths checked against
the keeper's bound.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
import time
from typing import Any

if __name__ != "__elasticd_keeper__":
    from elasticd.workers.snapshot_program.protocol import BadMessage
    from elasticd.workers.snapshot_program.replies import Refused, Sending, parse_reply
    from elasticd.workers.snapshot_program.requests import MAX_HEAD, Get, Message, encode_message

TAG = 32
CHUNK = 4 << 20
IO_TIMEOUT_S = 10.0  # per receive or send: a silent peer does not hold a keeper's link for long
LENGTH = struct.Struct("!I")


def tag(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod="sha256")
    for part in parts:
        mac.update(part)
    return mac.digest()


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    recv_into(sock, memoryview(buf), None, deadline)
    return bytes(buf)


def recv_into(sock: socket.socket, view: memoryview, mac: Any, deadline: float | None = None) -> None:
    """Fill ``view`` from ``sock`` (updating ``mac``); ``ConnectionError`` if the peer stops short,
    ``TimeoutError`` past ``deadline`` (``time.monotonic``) or a silent ``IO_TIMEOUT_S``."""
    got = 0
    while got < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the peer is too slow")
            sock.settimeout(min(left, IO_TIMEOUT_S))
        with view[got : got + CHUNK] as part:
            n = sock.recv_into(part)
            if n == 0:
                raise ConnectionError("peer closed the link")
            if mac is not None:
                with part[:n] as chunk:
                    mac.update(chunk)
        got += n


def send_head(sock: socket.socket, key: bytes, head: Message) -> bytes:
    data = encode_message(head)
    sock.sendall(LENGTH.pack(len(data)) + data + tag(key, data))
    return data


def recv_head(sock: socket.socket, key: bytes | None) -> bytes:
    """A head's bytes, its tag checked (``BadMessage`` if it is not the job's), all of it within
    ``IO_TIMEOUT_S``: a peer that trickles a head does not hold the link. The caller parses it
    (``requests``)."""
    deadline = time.monotonic() + IO_TIMEOUT_S
    (n,) = LENGTH.unpack(recv_exact(sock, LENGTH.size, deadline))
    if n > MAX_HEAD:
        raise BadMessage("head too long")
    data = recv_exact(sock, n, deadline)
    got = recv_exact(sock, TAG, deadline)
    sock.settimeout(IO_TIMEOUT_S)
    if key is None or not hmac.compare_digest(got, tag(key, data)):
        raise BadMessage("not signed with the job's key")
    return data


def nonce() -> str:
    return os.urandom(16).hex()


def connect(peer: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(peer, timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def fetch(peer: tuple[str, int], key: bytes, name: str, rank: int, step: int) -> bytearray:
    """A worker's ``get`` of a snapshot a keeper holds: the frame's bytes, authenticated."""
    with connect(peer) as sock:
        ask = nonce()
        send_head(sock, key, Get(name, rank, step, ask))
        raw = recv_head(sock, key)
        head = parse_reply(raw, Sending)
        if isinstance(head, Refused):
            raise BadMessage(head.error[:300])
        buf = bytearray(head.length)
        mac = hmac.new(key, digestmod="sha256")
        mac.update(ask.encode())
        mac.update(raw)
        recv_into(sock, memoryview(buf), mac)
        if not hmac.compare_digest(recv_exact(sock, TAG), mac.digest()):
            raise BadMessage("the replica's tag does not match (changed while it was sent, or forged)")
        return buf
