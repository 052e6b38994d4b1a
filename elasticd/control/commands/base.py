"""What a control command is: a name, a typed argument dataclass, and an async handler."""

from __future__ import annotations

import pwd
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon

A = TypeVar("A")


@dataclass(frozen=True)
class Caller:
    """Who sent a request, from the IPC peer credentials libzmq reports (``Peer-Address``)."""

    uid: int
    gid: int
    pid: int

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    @classmethod
    def from_peer_address(cls, peer: str | None) -> Caller | None:
        """``host:uid:gid:pid`` -> Caller; None when the transport gives no credentials."""
        if not peer:
            return None
        parts = peer.rsplit(":", 3)
        if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[1:]):
            return None
        return cls(int(parts[1]), int(parts[2]), int(parts[3]))


@dataclass(frozen=True)
class NoArgs:
    pass


@dataclass(frozen=True)
class Command(Generic[A]):
    name: str
    args: type[A]
    handler: Callable[[Daemon, A, Caller], Awaitable[Any]]

    @property
    def help(self) -> str:
        doc = self.handler.__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""
