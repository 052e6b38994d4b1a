"""The zygote program's store host: a child forked for a ``store`` request, serving torch's
``TCPStore`` for the job's ranks (standard library here; torch is the zygote's, imported already).

torchrun's agent hosts the rendezvous store and its workers are all clients of it
(``TORCHELASTIC_USE_AGENT_STORE=True``). elasticd's counterpart is this process: forked from the
job's zygote (so it costs a fork, not an import), it binds ``MASTER_PORT`` before any rank is
forked (no rank can reach the port before it listens) and outlives the ranks' restarts. The
zygote never serves the store itself: a ``TCPStore`` server runs threads, and the zygote must stay
a one-thread process to fork workers.

Its control socket (``SOCK_SEQPACKET``, handed over in the request) carries one JSON object per
message. It says ``{"ev": "listening", "pid", "port"}`` once the server listens, or
``{"ev": "store_failed", "error"}`` and exits; asked ``{"op": "clear", "attempt"}`` it deletes
every key (an attempt's ranks find none of the previous attempt's: torch 2.x's clients use no
per-attempt prefix) and says ``{"ev": "cleared", "attempt", "keys"}``. It exits when the socket
closes (the daemon stopped it) and dies with the zygote (its parent-death signal).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

if __name__ != "__elasticd_zygote__":  # the daemon's tests and mypy; in the zygote, globals already
    from elasticd.workers.zygote_program.child import _die_with_zygote

MAX_STORE_MESSAGE = 4096


class BadStoreRequest(ValueError):
    pass


def parse_store_op(req: dict[str, Any], nfds: int) -> dict[str, Any]:
    """A ``store`` request (already JSON): ``{"op": "store", "id", "host", "port", "fds": ["ctl"]}``."""
    rid, host, port = req.get("id"), req.get("host"), req.get("port")
    if type(rid) is not int or rid < 0:
        raise BadStoreRequest("id must be a non-negative integer")
    if not isinstance(host, str) or not 0 < len(host) <= 255:
        raise BadStoreRequest("host must be a name or an address")
    if type(port) is not int or not 0 <= port <= 65535:
        raise BadStoreRequest("port must be 0..65535")
    if req.get("fds") != ["ctl"] or nfds != 1:
        raise BadStoreRequest("a store request carries its control socket alone")
    return {"op": "store", "id": rid, "host": host, "port": port, "fds": ["ctl"]}


def parse_clear(data: bytes) -> int:
    """The attempt a ``clear`` request names; ``BadStoreRequest`` for anything else."""
    try:
        msg = json.loads(data)
    except ValueError:
        raise BadStoreRequest("not JSON") from None
    if not isinstance(msg, dict) or msg.get("op") != "clear":
        raise BadStoreRequest("not a clear request")
    attempt = msg.get("attempt")
    if type(attempt) is not int or attempt < 0:
        raise BadStoreRequest("attempt must be a non-negative integer")
    return attempt


def _own_socket(fd: int) -> socket.socket:
    """Keep only the control socket (as fd 3) and /dev/null on 0-2: not the zygote's control
    socket, not its children's pidfds, not another rank's fds."""
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    if null > 2:
        os.close(null)
    return socket.socket(fileno=3)


def _listener(host: str, port: int) -> socket.socket:
    """A socket bound to ``host`` alone (loopback for a job of one node, else the node's workers'
    address), listening: torch's own server would bind every address, so it is handed this one."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's server does
    sock.bind(addr)
    sock.listen(4096)
    return sock


def _tcp_store(host: str, port: int) -> tuple[Any, socket.socket]:
    """torch's ``TCPStore`` server on ``port`` at ``host`` only, from the torch the zygote imported
    (a store host never imports it: that would cost what the zygote saves), and its listening
    socket: the server serves on that fd, so the caller keeps it open as long as the store."""
    import importlib

    if "torch" not in sys.modules:
        raise RuntimeError("the zygote has not imported torch")
    dist = importlib.import_module("torch.distributed")
    sock = _listener(host, port)
    store = dist.TCPStore(
        host, sock.getsockname()[1], is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno()
    )
    return store, sock


def serve_store(req: dict[str, Any]) -> None:
    """In the forked child: host the store until the daemon closes the socket. Never returns."""
    code = 1
    try:
        _die_with_zygote(req["zygote"])
        sock = _own_socket(req["fds"]["ctl"])
        try:
            store, _listening = _tcp_store(req["host"], req["port"])
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:400]
            sock.send(json.dumps({"ev": "store_failed", "error": error}).encode())
            os._exit(1)
        sock.send(json.dumps({"ev": "listening", "pid": os.getpid(), "port": int(store.port)}).encode())
        while True:
            data = sock.recv(MAX_STORE_MESSAGE)
            if not data:  # the daemon stopped us
                code = 0
                break
            try:
                attempt = parse_clear(data)
            except BadStoreRequest:
                break
            keys = store.list_keys()
            for key in keys:
                store.delete_key(key)
            sock.send(json.dumps({"ev": "cleared", "attempt": attempt, "keys": len(keys)}).encode())
    except BaseException:
        code = 1
    os._exit(code)  # no finalisation: the server's threads stop with the process
