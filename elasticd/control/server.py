"""The control socket: ZeroMQ ROUTER over IPC, one task per request, errors mapped in one place.

Callers are identified by the kernel-verified peer credentials that libzmq exposes for IPC
connections, never by anything in the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from elasticd import log
from elasticd.control.address import endpoint
from elasticd.control.commands import REGISTRY
from elasticd.control.envelope import (
    TRANSPORT_LIMIT_BYTES,
    best_effort_id,
    encode_error,
    encode_ok,
    parse_request,
)
from elasticd.control.params import parse_args
from elasticd.errors import ConfigError, ElasticdError, PermissionDenied, UnknownCommand
from elasticd.manager.access import Caller
from elasticd.manager.service import CommandService

_log = log.get("elasticd.control")


def _socket_in_use(path: Path) -> bool:
    """Is a live daemon already answering on ``path``? (A stale file from a crash is not.)"""
    ctx: Any = zmq.Context.instance()
    probe = ctx.socket(zmq.DEALER)
    probe.setsockopt(zmq.LINGER, 0)
    try:
        probe.connect(endpoint(path))
        probe.send(b'{"v":1,"id":"probe","cmd":"ping","args":{}}')
        return bool(probe.poll(300))
    finally:
        probe.close()


class ControlServer:
    def __init__(self, service: CommandService, path: Path, mode: int, group: str) -> None:
        self._service = service
        self.path = path
        self._mode = mode
        self._group = group
        self._ctx = zmq.asyncio.Context()
        self._sock: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    def bind(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            if _socket_in_use(self.path):
                raise ConfigError(f"another elasticd is already listening on {self.path}")
            self.path.unlink()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, TRANSPORT_LIMIT_BYTES)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.bind(endpoint(self.path))
        os.chmod(self.path, self._mode)
        with contextlib.suppress(KeyError, PermissionError):
            os.chown(self.path, -1, grp.getgrnam(self._group).gr_gid)
        self._sock = sock
        _log.info("control.listening", socket=str(self.path), mode=oct(self._mode))

    async def serve(self) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            peer = frames[-1].get("Peer-Address") if frames else None
            envelope = [f.bytes for f in frames[:-1]]
            task = asyncio.create_task(
                self._handle(envelope, frames[-1].bytes, Caller.from_peer_address(peer))
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _handle(self, envelope: list[bytes], payload: bytes, caller: Caller | None) -> None:
        rid = ""
        cmd = "?"
        try:
            rid = best_effort_id(payload)
            request = parse_request(payload)
            rid, cmd = request.id, request.cmd
            command = REGISTRY.get(request.cmd)
            if command is None:
                raise UnknownCommand(f"unknown command {request.cmd!r}; known: {sorted(REGISTRY)}")
            if caller is None:
                raise PermissionDenied("the transport gave no peer credentials; use the local IPC socket")
            args = parse_args(command.args, request.args)
            await self._service.authorize(
                command.access, caller, command.job_of(args), command.admin_option(args)
            )
            result = await command.handler(self._service, args, caller)
            reply = encode_ok(rid, result)
        except ElasticdError as exc:
            _log.info("control.error", cmd=cmd, code=exc.code.value, message=exc.message)
            reply = encode_error(rid, exc)
        except Exception as exc:
            _log.exception("control.internal_error", cmd=cmd)
            reply = encode_error(rid, exc)
        try:  # not copied again (``copy``): ``status`` of every job replies with ~1 MB
            await self._sock.send_multipart([*envelope, reply], copy=False)
        except zmq.ZMQError as exc:  # the client went away; nothing to tell
            _log.debug("control.reply_dropped", error=str(exc))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._ctx.term()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
