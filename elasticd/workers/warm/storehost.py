"""The daemon's side of a job's store host: a ``TCPStore`` server forked from the job's zygote
(``zygote_program.storehost``), which every rank reaches as a client, as torchrun's workers reach
their agent's store.

It runs the user's interpreter as the submitter, so what it says is untrusted: one bounded message
at a time, parsed by ``wire.parse_store_message``; its pid is believed only as the zygote's child
(``Zygote.fork_store``), and its port only when it is the one asked for. The daemon never connects
to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket

from elasticd import log
from elasticd.workers.warm.messages import MAX_MESSAGE, Cleared, Listening, StoreFailed, parse_store_message
from elasticd.workers.warm.spawn import ZygoteError
from elasticd.workers.warm.zygote import Zygote

_log = log.get("elasticd.store")

READY_TIMEOUT_S = 10.0  # a fork and a bind; longer means none
NO_TORCH = "the warm parent has no torch (the script cannot import it): no store to serve"
CLEAR_TIMEOUT_S = 5.0  # deleting an idle store's keys
STOP_TIMEOUT_S = 2.0  # for its exit once its socket closed, before a SIGKILL


class StoreError(Exception):
    """The store host could not start, or stopped answering."""


class StoreHost:
    """One job's store host on this node. Methods run on the event-loop thread."""

    def __init__(
        self, job: str, pid: int, port: int, sock: socket.socket, exited: asyncio.Future[int]
    ) -> None:
        self.job = job
        self.pid = pid
        self.port = port
        self._sock = sock
        self._exited = exited
        self.served_peers = False  # a round of several nodes used it: never offered again

    @property
    def alive(self) -> bool:
        return not self._exited.done() and self._sock.fileno() >= 0

    async def clear(self, attempt: int) -> None:
        """Delete every key before this node joins ``attempt``'s round (so before any rank of it,
        here or on another node, can connect): the previous attempt's keys (gloo's addresses among
        them) must not be read as theirs. Raises ``StoreError``."""
        if not self.alive:
            raise StoreError("the store host has ended")
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(self._sock, json.dumps({"op": "clear", "attempt": attempt}).encode())
            msg = await asyncio.wait_for(_receive(self._sock), CLEAR_TIMEOUT_S)
        except (OSError, ValueError, TimeoutError) as exc:
            raise StoreError(f"no answer to a clear: {exc or type(exc).__name__}") from exc
        if not isinstance(msg, Cleared) or msg.attempt != attempt:
            raise StoreError(f"answered a clear with {msg}")
        _log.info("store.cleared", job=self.job, pid=self.pid, attempt=attempt, keys=msg.keys)

    async def close(self) -> None:
        """Close its socket (it exits), then wait for its end, SIGKILL past ``STOP_TIMEOUT_S``.
        Its pid stays its own until the zygote reaps it, which the exit future waits for."""
        self._sock.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), STOP_TIMEOUT_S)
        _log.info("store.stopped", job=self.job, pid=self.pid, port=self.port)


async def _receive(sock: socket.socket) -> object:
    data = await asyncio.get_running_loop().sock_recv(sock, MAX_MESSAGE + 1)
    if not data:
        raise ValueError("closed its socket")
    return parse_store_message(data)


async def start(zygote: Zygote, host: str, port: int) -> StoreHost:
    """Fork the store host from ``zygote`` and wait until it listens on ``port``. Raises
    ``StoreError`` (it is stopped then)."""
    if not zygote.torch:
        raise StoreError(NO_TORCH)
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError as exc:  # out of fds: no store host, the round goes on without one
        raise StoreError(f"socketpair: {exc}") from exc
    ours.setblocking(False)
    try:
        pid, exited = await zygote.fork_store(host, port, theirs.fileno())
    except ZygoteError as exc:
        ours.close()
        raise StoreError(str(exc)) from exc
    finally:
        theirs.close()
    host_ = StoreHost(zygote.job, pid, port, ours, exited)
    try:
        msg = await asyncio.wait_for(_receive(ours), READY_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError) as exc:
        await host_.close()
        raise StoreError(f"not listening: {exc or type(exc).__name__}") from exc
    if isinstance(msg, StoreFailed):
        await host_.close()
        raise StoreError(msg.error)
    if not isinstance(msg, Listening) or msg.pid != pid or msg.port != port:
        await host_.close()
        raise StoreError(f"said {msg}, not that pid {pid} listens on {port}")
    _log.info("store.listening", job=zygote.job, pid=pid, port=port)
    return host_
