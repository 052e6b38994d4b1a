"""A synchronous client for the control socket: one DEALER, request ids, bounded waits."""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from elasticctl.entry import UsageError
from elasticd.control.address import endpoint
from elasticd.control.envelope import encode_request
from elasticd.wire import COMMANDS, NoArgs, NodesReply, request


class Unreachable(Exception):
    """The daemon did not answer; the message says why and what to try."""


class DaemonError(Exception):
    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}


def _hint(path: Path) -> str:
    return (
        f"is elasticd running? Start it with `systemctl start elasticd` (or run `elasticd`), "
        f"or point ELASTICD_SOCKET at its socket (tried {path})"
    )


class Client:
    def __init__(self, path: Path, timeout_s: float = 15.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._ctx: Any = zmq.Context.instance()
        self._sock: Any = None

    def _socket(self) -> Any:
        if self._sock is None:
            if not self.path.exists():
                raise Unreachable(f"cannot reach elasticd: no socket at {self.path}; {_hint(self.path)}")
            if not os.access(self.path, os.R_OK | os.W_OK):
                raise Unreachable(
                    f"cannot reach elasticd: permission denied on {self.path}; "
                    "ask an administrator to add you to the 'elastic' group"
                )
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint(self.path))
            self._sock = sock
        return self._sock

    def request(self, cmd: str, args: object, timeout_s: float | None = None) -> Any:
        """Run ``cmd`` with its argument dataclass from ``elasticd.wire``; returns the result,
        of the command's reply type there (``COMMANDS[cmd].reply``)."""
        schema = COMMANDS.get(cmd)
        if schema is None or type(args) is not schema.args:
            takes = schema.args.__name__ if schema else "nothing: no such command"
            raise TypeError(f"{cmd} takes {takes}, not {type(args).__name__}")
        return self.call(cmd, timeout_s, **request(args))

    def call(self, cmd: str, timeout_s: float | None = None, **args: Any) -> Any:
        """Send a request with raw JSON arguments (``request`` builds them from the schema)."""
        sock = self._socket()
        rid = os.urandom(16).hex()  # as random as uuid4's 32 hex digits, without importing uuid (~2 ms)
        sock.send(encode_request(rid, cmd, args))
        deadline_ms = int((timeout_s or self.timeout_s) * 1000)
        while True:
            if not sock.poll(deadline_ms):
                self.close()
                raise Unreachable(
                    f"cannot reach elasticd: no answer within {timeout_s or self.timeout_s:.0f}s; "
                    f"{_hint(self.path)}"
                )
            reply = decode(sock.recv())
            if reply.get("id") != rid:
                continue  # a late reply to an earlier request: not ours
            if reply.get("ok"):
                return reply.get("result")
            err = reply.get("error") or {}
            raise DaemonError(
                err.get("code", "internal"), err.get("message", "unknown error"), err.get("details")
            )

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


def decode(raw: bytes) -> Any:
    """A reply, decoded with the cycle collector paused. JSON makes no reference cycles, but the
    reply of every job (about 1 MB, tens of thousands of containers) made the collector run a
    dozen times mid-decode, full passes over the whole heap among them: 20-28 ms of a 45 ms
    ``status --json`` with a thousand jobs. Paused, the new containers meet one young collection
    after the decode instead."""
    was = gc.isenabled()
    gc.disable()
    try:
        return json.loads(raw)
    finally:
        if was:
            gc.enable()


def local_gpus(client: Client) -> int:
    """How many GPUs this node has (as its daemon counts them), for ``--nproc-per-node gpu``."""
    node = client.request("ping", NoArgs())["node"]
    nodes: NodesReply = client.request("nodes", NoArgs())
    return next((len(n["inventory"]["gpus"]) for n in nodes["nodes"] if n["node"] == node), 0)


@dataclass(frozen=True)
class ExitCodes:
    """What a command line exits with when it cannot do its work."""

    usage: int
    unreachable: int
    daemon_error: int


def guarded(prog: str, client: Client, body: Callable[[], int], codes: ExitCodes) -> int:
    """Run ``body``, turning the CLI's errors into one line on stderr and an exit code."""
    try:
        return body()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return codes.usage
    except Unreachable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return codes.unreachable
    except DaemonError as exc:
        print(f"{prog}: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return codes.daemon_error
    finally:
        client.close()
