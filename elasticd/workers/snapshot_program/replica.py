"""Keeper to keeper, and worker to keeper, over the workers' network: replicas of snapshots
(standard library only; part of the keeper's program, after ``protocol``).

Every exchange is authenticated with the job's key (HMAC-SHA256): 32 random bytes that the job's
ranks agree on in ``load_checkpoint`` and hand to their keepers over the keepers' private UNIX
sockets, so only the job's own processes hold it; another job, or another local user, can neither
write nor read a replica. The link is not encrypted (as gloo's is not): it carries the same
tensors the collectives do.

Messages: a JSON head (at most ``MAX_HEAD`` bytes, its length first as 4 bytes) and its tag, so a
peer without the key is refused before it can make the keeper allocate anything; for a ``put``,
then ``length`` bytes of the frame and a tag over head and frame; for a ``get``, the reply's head,
the frame and a tag over the request's nonce, the reply's head and the frame. Everything received
is untrusted: heads are parsed and bounded here, lengths checked against the keeper's bound.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import socket
import struct
import time
from typing import Any

if __name__ != "__elasticd_keeper__":
    from elasticd.workers.snapshot_program.protocol import MAX_NAME, MAX_RANK, MAX_STEP, BadMessage

MAX_HEAD = 4096
TAG = 32
KEY_BYTES = 32
MAX_LENGTH = 1 << 44
CHUNK = 4 << 20
IO_TIMEOUT_S = 10.0  # per receive or send: a silent peer does not hold a keeper's link for long
LENGTH = struct.Struct("!I")


def parse_key(value: Any) -> bytes | None:
    """A key as the workers pass it (64 hex digits), or None."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 2 * KEY_BYTES:
        raise BadMessage("key must be 64 hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise BadMessage("key must be 64 hex digits") from None


def parse_peer(address: Any, port: Any) -> tuple[str, int] | None:
    if address is None:
        return None
    try:
        ip = str(ipaddress.ip_address(address))
    except ValueError:
        raise BadMessage("peer address must be an IP address") from None
    if type(port) is not int or not 0 < port < 65536:
        raise BadMessage("peer port must be 1..65535")
    return ip, port


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


def send_head(sock: socket.socket, key: bytes, head: dict[str, Any]) -> bytes:
    data = json.dumps(head, separators=(",", ":")).encode()
    sock.sendall(LENGTH.pack(len(data)) + data + tag(key, data))
    return data


def recv_head(sock: socket.socket, key: bytes | None) -> tuple[dict[str, Any], bytes]:
    """A head and its bytes, its tag checked (``BadMessage`` if it is not the job's), all of it
    within ``IO_TIMEOUT_S``: a peer that trickles a head does not hold the link."""
    deadline = time.monotonic() + IO_TIMEOUT_S
    (n,) = LENGTH.unpack(recv_exact(sock, LENGTH.size, deadline))
    if n > MAX_HEAD:
        raise BadMessage("head too long")
    data = recv_exact(sock, n, deadline)
    got = recv_exact(sock, TAG, deadline)
    sock.settimeout(IO_TIMEOUT_S)
    if key is None or not hmac.compare_digest(got, tag(key, data)):
        raise BadMessage("not signed with the job's key")
    try:
        head = json.loads(data)
    except (ValueError, RecursionError):
        raise BadMessage("head is not JSON") from None
    if not isinstance(head, dict):
        raise BadMessage("head is not an object")
    return head, data


def _bounded(head: dict[str, Any], key: str, top: int) -> int:
    value = head.get(key)
    if type(value) is not int or not 0 <= value <= top:
        raise BadMessage(f"{key} must be an integer in 0..{top}")
    return value


def parse_transfer(head: dict[str, Any]) -> dict[str, Any]:
    """A ``put`` (name, rank, step, length, nonce) or ``get`` (name, rank, step, nonce) head."""
    op = head.get("op")
    if op not in ("put", "get"):
        raise BadMessage("op must be put or get")
    name, nonce = head.get("name"), head.get("nonce")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise BadMessage("bad name")
    if not isinstance(nonce, str) or len(nonce) != 32:
        raise BadMessage("bad nonce")
    out = {
        "op": op,
        "name": name,
        "rank": _bounded(head, "rank", MAX_RANK),
        "step": _bounded(head, "step", MAX_STEP),
    }
    out["nonce"] = nonce
    if op == "put":
        out["length"] = _bounded(head, "length", MAX_LENGTH)
    return out


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
        send_head(sock, key, {"op": "get", "name": name, "rank": rank, "step": step, "nonce": ask})
        head, raw = recv_head(sock, key)
        if head.get("ok") is not True:
            raise BadMessage(str(head.get("error", "refused"))[:300])
        length = _bounded(head, "length", MAX_LENGTH)
        buf = bytearray(length)
        mac = hmac.new(key, digestmod="sha256")
        mac.update(ask.encode())
        mac.update(raw)
        recv_into(sock, memoryview(buf), mac)
        if not hmac.compare_digest(recv_exact(sock, TAG), mac.digest()):
            raise BadMessage("the replica's tag does not match (changed while it was sent, or forged)")
        return buf
