"""Who may use which command: every permission check of the control socket, in one place.

The socket's mode and group decide who can connect at all (group ``elastic`` by default). Beyond
that, each command declares an ``Access`` level and ``authorize`` enforces it before the handler
runs, with the caller's kernel-verified credentials. Handlers contain no permission checks.

| level     | who                                                    | commands                         |
|-----------|--------------------------------------------------------|----------------------------------|
| CONNECTED | anyone who can open the socket                         | ping, submit, status, nodes      |
| OWNER     | the named job's owner, or root; with no job named: root | kill, logs, drain, undrain      |
| ROOT      | root only                                              | (none yet)                       |
| HISTORY   | anyone; a job's events only to its owner and root      | events                           |

``events`` shows the history of jobs that may be gone (removed, expired): an event of a job is
shown to root, and to the job's owner while the job exists (``may_read_job``); events of no job
(a node started, was drained) to anyone, as ``nodes`` shows nodes to anyone.
"""

from __future__ import annotations

import pwd
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from elasticd.errors import PermissionDenied

ROOT_UID = 0


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


OwnerLookup = Callable[[str], Awaitable[tuple[int, str] | None]]
"""job id -> (uid, user name) of its owner; None when the job's spec cannot be read (root only).
Raises JobNotFound for a job that does not exist."""


class Access(StrEnum):
    CONNECTED = "connected"
    OWNER = "owner"
    ROOT = "root"
    HISTORY = "history"  # events: filtered per job by ``may_read_job``, and a named job is checked


async def authorize(access: Access, caller: Caller, job_id: str | None, owner_of: OwnerLookup) -> None:
    """Raise PermissionDenied unless ``caller`` may use a command of level ``access`` on ``job_id``.

    The job is looked up even for root, so that an unknown job is ``job_not_found`` for everyone.
    """
    if access is Access.CONNECTED:
        return
    if access is Access.HISTORY:
        if job_id is not None and caller.uid != ROOT_UID:
            await authorize(Access.OWNER, caller, job_id, owner_of)  # a job that is gone: root only
        return
    if access is Access.ROOT or job_id is None:
        if caller.uid != ROOT_UID:
            raise PermissionDenied("only root may do this" + ("" if job_id is None else f" to job {job_id}"))
        return
    owner = await owner_of(job_id)
    if caller.uid == ROOT_UID:
        return
    if owner is None:
        raise PermissionDenied(f"job {job_id} has no readable owner; only root may act on it")
    uid, user = owner
    if caller.uid != uid:
        raise PermissionDenied(f"job {job_id} belongs to {user}; only they or root may do this")


def may_read_job(caller: Caller, owner: tuple[int, str] | None) -> bool:
    """Whether ``caller`` may read a job's events (``owner``: None when the job is gone or its spec
    cannot be read: root only)."""
    return caller.uid == ROOT_UID or (owner is not None and owner[0] == caller.uid)
