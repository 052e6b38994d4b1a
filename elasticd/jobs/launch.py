"""Turning a round's result into this node's worker group, and a failed worker into a report."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from elasticd.jobs.env import WorldLayout, worker_env
from elasticd.jobs.spec import JobSpec
from elasticd.jobs.state import WorkerFailure
from elasticd.node.inventory import Inventory
from elasticd.rendezvous.model import Member, RoundResult
from elasticd.workers.group import Launch, Worker, WorkerGroup
from elasticd.workers.reaper import Reaper

TAIL_BYTES = 4096
TAIL_LINES = 30


@dataclass(frozen=True)
class NodeRuntime:
    """What every job on this node shares."""

    node_id: str
    address: str
    log_dir: Path
    inventory: Inventory
    reaper: Reaper
    liveness_port: int = 0  # see elasticd.node.liveness


def attempt_dir(log_dir: Path, job_id: str, attempt: int) -> Path:
    return log_dir / job_id / f"attempt_{attempt}"


def layout_for(result: RoundResult, me: Member) -> WorldLayout:
    return WorldLayout(
        round=result.round,
        group_rank=me.group_rank,
        group_world_size=len(result.members),
        rank_offset=me.rank_offset,
        world_size=result.world_size,
        local_world_size=me.local_world_size,
        master_addr=result.master_addr,
        master_port=result.master_port,
    )


def _identity(spec: JobSpec) -> tuple[int | None, int | None, tuple[int, ...] | None]:
    """Workers run as the submitter; only a root daemon needs (and is able) to switch."""
    if os.geteuid() != 0 or spec.uid == 0:
        return None, None, None
    try:
        groups = tuple(os.getgrouplist(pwd.getpwuid(spec.uid).pw_name, spec.gid))
    except KeyError:
        groups = (spec.gid,)
    return spec.uid, spec.gid, groups


def start_group(
    rt: NodeRuntime,
    spec: JobSpec,
    layout: WorldLayout,
    attempt: int,
    restart_count: int,
    slots: tuple[int, ...],
    fence: bool,
) -> WorkerGroup:
    """Spawn this node's workers for one round (on the event-loop thread)."""
    directory = attempt_dir(rt.log_dir, spec.id, attempt)
    directory.mkdir(parents=True, exist_ok=True)
    uid, gid, groups = _identity(spec)
    if uid is not None:
        for d in (directory.parent, directory):
            os.chown(d, uid, gid if gid is not None else -1)
    visible = rt.inventory.visible_devices(slots)
    launches = []
    for local_rank in range(layout.local_world_size):
        rank = layout.rank_offset + local_rank
        error_file = directory / f"rank_{rank}.error.json"
        error_file.unlink(missing_ok=True)
        env = worker_env(
            base=spec.env,
            layout=layout,
            local_rank=local_rank,
            run_id=spec.id,
            restart_count=restart_count,
            max_restarts=spec.max_restarts,
            visible_devices=visible,
            error_file=str(error_file),
            owner=rt.node_id,
        )
        launches.append(
            Launch(
                local_rank=local_rank,
                rank=rank,
                argv=tuple(spec.argv),
                env=env,
                cwd=spec.cwd,
                log_path=directory / f"rank_{rank}.log",
                error_file=error_file,
                uid=uid,
                gid=gid,
                extra_groups=groups,
            )
        )
    group = WorkerGroup(launches, rt.reaper, spec.stop_grace_s, fence=fence)
    group.start()
    return group


def read_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-TAIL_LINES:])


def read_error_file(path: Path) -> str:
    """The message torch's ``@record`` wrote to TORCHELASTIC_ERROR_FILE, if any."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    message = data.get("message", "") if isinstance(data, dict) else ""
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message).strip()
    return text.splitlines()[-1] if text else ""


def describe_failure(node: str, attempt: int, worker: Worker) -> WorkerFailure:
    launch = worker.launch
    return WorkerFailure.from_exit(
        node=node,
        attempt=attempt,
        rank=launch.rank,
        local_rank=launch.local_rank,
        returncode=worker.exited.result(),
        message=read_error_file(launch.error_file),
        tail=read_tail(launch.log_path),
    )
