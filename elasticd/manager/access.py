"""Who may use which command: every permission check of the control socket, in one place.

The socket's mode and group decide who can connect at all (group ``elastic`` by default). Beyond
that, each command declares an ``Access`` level and ``authorize`` enforces it before the handler
runs, with the caller's kernel-verified credentials. Handlers contain no permission checks.

| level     | who                                                    | commands                         |
|-----------|--------------------------------------------------------|----------------------------------|
| CONNECTED | anyone who can open the socket                         | ping, submit, status, nodes      |
| OWNER     | the named job's owner, or root; with no job named: root | kill, logs, drain, undrain      |
| ROOT      | root only                                              | (none yet)                       |
| ADMIN     | root and ``admin_group``'s members (``Admins``)         | check                            |
| HISTORY   | anyone; a job's events only to its owner and root      | events                           |

Some options are for admins only, whatever the command's level: a command names them
(``Command.admin_option``) and ``authorize`` refuses them to others. An **admin** is root, or a
member of the ``admin_group`` setting (its primary group or a supplementary one, as the system's
group database says for the caller's uid; ``Admins``). That one definition decides both who may
set a job's ``--priority`` and who gets the admin limits (``jobs.quota``), at submit and on the
scan (a spec's own ``gid`` is never trusted for it: it may have been written around the daemon).

``events`` shows the history of jobs that may be gone (removed, expired): an event of a job is
shown to root, and to the job's owner while the job exists (``may_read_job``); events of no job
(a node started, was drained) to anyone, as ``nodes`` shows nodes to anyone.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum

from elasticd.errors import ConfigError, PermissionDenied

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


def user_groups(uid: int) -> frozenset[int]:
    """The groups the system's group database gives ``uid`` (its primary group included);
    none for a uid that has no name."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))


@dataclass(frozen=True)
class Admins:
    """Who is an admin (module doc): root, and ``admin_group``'s members (``gid``; None: root only)."""

    gid: int | None = None
    groups_of: Callable[[int], frozenset[int]] = field(default=user_groups, compare=False)

    @classmethod
    def of_group(cls, name: str | None) -> Admins:
        """From the ``admin_group`` setting: a group name or number."""
        if name is None:
            return cls()
        try:
            return cls(int(name) if name.isdigit() else grp.getgrnam(name).gr_gid)
        except KeyError:
            raise ConfigError(f"admin_group {name!r}: no such group") from None

    def __call__(self, uid: int) -> bool:
        """Whether ``uid`` is an admin."""
        return uid == ROOT_UID or (self.gid is not None and self.gid in self.groups_of(uid))

    def who(self) -> str:
        return "root" if self.gid is None else "root and members of admin_group"


ROOT_ONLY = Admins()

OwnerLookup = Callable[[str], Awaitable[tuple[int, str] | None]]
"""job id -> (uid, user name) of its owner; None when the job's spec cannot be read (root only).
Raises JobNotFound for a job that does not exist."""


class Access(StrEnum):
    CONNECTED = "connected"
    OWNER = "owner"
    ROOT = "root"
    ADMIN = "admin"  # root and admin_group's members: what runs processes and moves data on every node
    HISTORY = "history"  # events: filtered per job by ``may_read_job``, and a named job is checked


async def authorize(
    access: Access,
    caller: Caller,
    job_id: str | None,
    owner_of: OwnerLookup,
    admin_option: str | None = None,
    admins: Admins = ROOT_ONLY,
) -> None:
    """Raise PermissionDenied unless ``caller`` may use a command of level ``access`` on ``job_id``,
    with ``admin_option`` (an option the request uses that only admins may: ``--priority``).

    The job is looked up even for root, so that an unknown job is ``job_not_found`` for everyone.
    """
    if admin_option is not None and not admins(caller.uid):
        raise PermissionDenied(f"only {admins.who()} may use {admin_option}")
    if access is Access.CONNECTED:
        return
    if access is Access.ADMIN:
        if not admins(caller.uid):
            raise PermissionDenied(f"only {admins.who()} may do this")
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
