"""What the control socket's commands can do, and who may: the one service they are given.

Command handlers (``elasticd.control.commands``) receive a ``CommandService``, never the daemon:
every read and write they make goes through it (the job commands' through ``jobs``, the node
commands' through ``nodes``), and every permission check is here (``authorize``, with the rules
of ``elasticd.manager.access``), with the owner reads it needs and the event history, which is
filtered by owner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import replace

from elasticd.decode import DecodeError
from elasticd.errors import InvalidSpec, JobNotFound
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.types import Query
from elasticd.history.schema import EventsArgs
from elasticd.history.store import EventLog, Page
from elasticd.jobs import quota
from elasticd.jobs.quota import Limits
from elasticd.jobs.rate import SubmitWindow
from elasticd.manager.access import ROOT_UID, Access, Caller, authorize, may_read_job
from elasticd.manager.etcdspace import SpaceWatch
from elasticd.manager.facts import NodeFacts
from elasticd.manager.jobcommands import JobCommands
from elasticd.manager.jobmanager import JobManager
from elasticd.manager.nodecommands import NodeCommands
from elasticd.node.registry import NodeRegistry
from elasticd.rendezvous import rosterread
from elasticd.terms.head import parse_head
from elasticd.terms.ids import valid_job_id


class CommandService:
    def __init__(
        self,
        facts: NodeFacts,
        manager: JobManager,
        registry: NodeRegistry,
        kv: KV,
        keys: Keys,
        space: SpaceWatch | None = None,
    ) -> None:
        self.facts = facts
        self._kv = kv
        self._keys = keys
        self._events = EventLog(kv, keys)
        self._submits = SubmitWindow()  # submits per user per minute through this node
        self.jobs = JobCommands(facts, manager, registry, self._events, rosterread.Rounds(kv, keys), space)
        self.nodes = NodeCommands(manager, registry, kv, keys, space)

    # -- permissions and limits -------------------------------------------------------------------
    async def authorize(
        self, access: Access, caller: Caller, job_id: str | None, admin_option: str | None = None
    ) -> None:
        """Raise PermissionDenied unless ``caller`` may use a command of level ``access`` on the
        job, with ``admin_option`` (an option only admins may use) if the request uses one."""
        await authorize(access, caller, job_id, self.owner_of, admin_option, self.facts.admins)

    def limits_of(self, caller: Caller) -> Limits:
        """The limits ``caller`` submits under: the admin ones for root and admins."""
        return self.facts.quotas.of(self.facts.admins(caller.uid))

    def count_submit(self, caller: Caller, limits: Limits) -> None:
        """Count a submit of ``caller``'s; QuotaExceeded past ``max_submits_per_minute``."""
        decision = self._submits.admit(caller.uid, limits.submits_per_minute.value, time.monotonic())
        if not decision.allowed:
            raise quota.rate_refusal(caller.user, decision.used, decision.retry_after_s, limits)

    async def owner_of(self, job_id: str) -> tuple[int, str] | None:
        """The job's owner (uid, user) for permission checks; None if its head is unreadable.

        One small read (the head, and whether the job has any key), not the whole job: every
        request on a job asks it first, ``logs -f`` several times a second."""
        if not valid_job_id(job_id):
            raise JobNotFound(f"no job {job_id[:80]!r}")
        queries = [
            Query(self._keys.job_spec(job_id)),
            Query(self._keys.job(job_id), prefix=True, count_only=True),
        ]
        spec, keys = await asyncio.to_thread(self._kv.read_many, queries)
        if not keys.count:
            raise JobNotFound(f"no job {job_id!r}")
        return _owner(job_id, spec.kvs[0].value if spec.kvs else None)

    async def owners_of(self, jobs: Collection[str]) -> dict[str, tuple[int, str] | None]:
        """Each job's owner, as ``owner_of`` but in one read and with None for a job that is gone."""
        wanted = sorted(j for j in set(jobs) if valid_job_id(j))
        found = await asyncio.to_thread(self._kv.read_many, [Query(self._keys.job_spec(j)) for j in wanted])
        return {j: _owner(j, f.kvs[0].value if f.kvs else None) for j, f in zip(wanted, found, strict=True)}

    # -- the event history ------------------------------------------------------------------------
    async def events(self, args: EventsArgs, caller: Caller) -> Page:
        """The history after ``args.after``: the named job's, or all; only the events ``caller``
        may read (``access.may_read_job``)."""
        page = await asyncio.to_thread(self._events.read, args.after, None, args.job)
        chosen = page.events
        if caller.uid != ROOT_UID:
            owners = await self.owners_of({e.event.job for e in chosen if e.event.job is not None})
            chosen = [
                e for e in chosen if e.event.job is None or may_read_job(caller, owners.get(e.event.job))
            ]
        if args.limit is not None:
            chosen = chosen[-args.limit :] if args.limit else []
        return replace(page, events=chosen)


def _owner(job_id: str, head: bytes | None) -> tuple[int, str] | None:
    """The owner a stored head names; None when it is missing, unreadable or of another job."""
    try:
        found = parse_head(head) if head is not None else None
    except (DecodeError, InvalidSpec):
        return None  # the janitor fails the job naming the key; only root may act on it meanwhile
    return (found.uid, found.user) if found is not None and found.id == job_id else None
