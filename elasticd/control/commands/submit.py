from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from elasticd.control.commands.base import Command
from elasticd.errors import InvalidSpec, PermissionDenied
from elasticd.jobs.admission import refuse_identity
from elasticd.jobs.pathcheck import check_paths
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.terms.ids import new_job_id, valid_job_id
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec, NodeRange, parse_hang_timeout
from elasticd.wire import SubmitArgs


def job_id(chosen: str | None, name: str) -> str:
    """The submitter's own id (every node running the same torchrun line names one job), or a new one."""
    if chosen is None:
        return new_job_id(name)
    if not valid_job_id(chosen):
        raise InvalidSpec(
            "job_id must be 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return chosen


def job_name(given: str | None, kind: EntryKind, entry: str) -> str:
    """The name given, or the script's (the module's last part): in the characters an id takes."""
    name = given or (
        os.path.splitext(os.path.basename(entry))[0]
        if kind is not EntryKind.MODULE
        else entry.rsplit(".", 1)[-1]
    )
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in name).lstrip("-_.")[:48] or "job"


def _spec(service: CommandService, args: SubmitArgs, caller: Caller) -> JobSpec:
    """The job's spec from the request: the caller's identity, this node's defaults."""
    try:
        kind = EntryKind(args.entry_kind)
    except ValueError as exc:
        raise InvalidSpec(f"entry_kind must be one of {[k.value for k in EntryKind]}") from exc
    name = job_name(args.name, kind, args.entry)
    nnodes = NodeRange.parse(args.nnodes)
    hang_s, hang_auto = parse_hang_timeout(args.hang_timeout)
    # A single-node job runs where it was submitted (as with torchrun) unless told otherwise.
    nodes = tuple(args.nodes) or ((service.facts.node_id,) if nnodes.max == 1 else ())
    return JobSpec(
        id=job_id(args.job_id, name),
        name=name,
        entry_kind=kind,
        entry=args.entry,
        args=tuple(args.args),
        python=args.python,
        cwd=args.cwd,
        env=args.env,
        uid=caller.uid,
        gid=caller.gid,
        user=caller.user,
        nnodes=nnodes,
        nproc_per_node=args.nproc_per_node,
        max_restarts=args.max_restarts,
        stop_grace_s=args.stop_grace_s if args.stop_grace_s is not None else service.facts.stop_grace_s,
        submitted_at=time.time(),
        nodes=nodes,
        last_call_s=args.last_call_s,
        join_timeout_s=args.join_timeout_s,
        submitted_on=service.facts.node_id,
        memory_limit_bytes=args.memory_limit_bytes,
        cpu_limit=args.cpu_limit,
        nofile=args.nofile,
        hang_timeout_s=hang_s,
        hang_timeout_auto=hang_auto,
        max_same_failures=args.max_same_failures,
        warm=args.warm,
        preload=tuple(args.preload),
        priority=args.priority,
        numa_binding=args.numa_binding,
        mig=args.mig,
        stragglers=args.stragglers,
        master_port=args.master_port,
        yields=args.yields,
        node_check=args.node_check if args.node_check is not None else service.facts.node_check,
    )


async def submit(service: CommandService, args: SubmitArgs, caller: Caller) -> dict[str, Any]:
    """Submit a job; it runs as the caller, with the environment and directory it was sent with.

    The spec goes into etcd; every daemon with room (and allowed by ``nodes``) may join it.
    Within the caller's limits (``jobs.quota``): submits a minute, the spec's size, jobs held.
    """
    refusal = refuse_identity(
        caller.uid, caller.user, service.facts.node_id, os.geteuid(), service.facts.allow_root_jobs
    )
    if refusal is not None:  # the same rule every node applies to the spec it reads
        raise PermissionDenied(refusal.reason)
    limits = service.limits_of(caller)
    service.count_submit(caller, limits)  # first: what follows costs the daemon work
    spec = _spec(service, args, caller)
    # Refuse at submit what could never start, instead of failing every attempt later; the
    # paths are checked as the caller, never with the daemon's (root's) permissions.
    problem = await asyncio.to_thread(check_paths, spec)
    if problem is not None:
        raise problem.to_submit_error()
    return await service.jobs.submit(spec, limits)


def _admin_option(args: SubmitArgs) -> str | None:
    return "--priority" if args.priority > 0 else None


COMMAND = Command("submit", SubmitArgs, submit, Access.CONNECTED, _admin_option)
