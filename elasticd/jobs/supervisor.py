"""One job on this node: start an attempt, watch it, restart or finish it, as the decider says.

The supervisor owns the job's worker group and nothing else. It reports every state change to
its ``on_change`` callback (the manager), which persists and publishes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticd import log
from elasticd.jobs.decider import Action, on_exits
from elasticd.jobs.env import WorldLayout, worker_env
from elasticd.jobs.spec import JobSpec
from elasticd.jobs.state import JobState, WorkerFailure, can_transition
from elasticd.netaddr import free_port
from elasticd.node.inventory import Inventory
from elasticd.workers.group import Launch, Worker, WorkerGroup
from elasticd.workers.reaper import Reaper

_log = log.get("elasticd.supervisor")

TAIL_BYTES = 4096
TAIL_LINES = 30


@dataclass(frozen=True)
class Runtime:
    """What every supervisor on this node shares."""

    node_id: str
    log_dir: Path
    inventory: Inventory
    reaper: Reaper


def attempt_dir(log_dir: Path, job_id: str, attempt: int) -> Path:
    return log_dir / job_id / f"attempt_{attempt}"


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
    message = data.get("message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message).strip().splitlines()[-1] if str(message).strip() else ""


class JobSupervisor:
    def __init__(self, spec: JobSpec, rt: Runtime, on_change: Callable[[JobSupervisor], None]) -> None:
        self.spec = spec
        self._rt = rt
        self._on_change = on_change
        self.state = JobState.PENDING
        self.reason = ""
        self.restarts = 0
        self.attempt = 0
        self.slots: tuple[int, ...] = ()
        self.failure: WorkerFailure | None = None
        self.group: WorkerGroup | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._stop: tuple[JobState, str] | None = None
        self._stop_requested = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    # -- state ------------------------------------------------------------------------------
    def _set(self, state: JobState, reason: str = "") -> None:
        if state is self.state and reason == self.reason:
            return
        if state is not self.state and not can_transition(self.state, state):
            _log.error("job.bad_transition", job=self.spec.id, old=self.state.value, new=state.value)
            return
        self.state, self.reason = state, reason
        if state.terminal:
            self.ended_at = time.time()
        _log.info("job.state", job=self.spec.id, state=state.value, reason=reason, restarts=self.restarts)
        self._on_change(self)

    def wait_reason(self, reason: str) -> None:
        """Why a PENDING job is not running yet (shown by ``status``)."""
        self._set(JobState.PENDING, reason)

    @property
    def world_size(self) -> int:
        return self.spec.nproc_per_node if self.state in (JobState.RUNNING, JobState.RESTARTING) else 0

    def view(self) -> dict[str, Any]:
        spec = self.spec
        out: dict[str, Any] = {
            "id": spec.id,
            "name": spec.name,
            "user": spec.user,
            "state": self.state.value,
            "reason": self.reason,
            "restarts": self.restarts,
            "max_restarts": spec.max_restarts,
            "attempt": self.attempt,
            "world_size": self.world_size,
            "nnodes": str(spec.nnodes),
            "nproc_per_node": spec.nproc_per_node,
            "nodes": [self._rt.node_id] if self.started_at else [],
            "devices": self._rt.inventory.visible_devices(self.slots) if self.slots else "",
            "argv": spec.argv,
            "submitted_at": spec.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "pids": [w.pid for w in self.group.workers if w.running] if self.group else [],
        }
        if self.failure is not None:
            out["failure"] = self.failure.to_json()
        if self.state is JobState.FAILED:
            out["error"] = self.failure.summary() if self.failure else self.reason
        return out

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, slots: tuple[int, ...]) -> None:
        self.slots = slots
        self.started_at = time.time()
        self.task = asyncio.create_task(self._run(), name=f"job-{self.spec.id}")

    def request_stop(self, state: JobState, reason: str) -> None:
        """Ask the job to end as ``state`` (KILLED on ``kill``, FAILED on daemon shutdown)."""
        if self.state.terminal or self._stop is not None:
            return
        self._stop = (state, reason)
        if self.task is None:  # still pending: nothing runs
            self._set(state, reason)
        self._stop_requested.set()

    async def wait(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)

    async def _run(self) -> None:
        try:
            while True:
                self.group = self._launch()
                self._set(JobState.RUNNING, f"attempt {self.attempt}")
                decision_action, reason = await self._supervise(self.group)
                await self.group.stop(self.spec.stop_grace_s)
                if decision_action is Action.RESTART:
                    self.restarts += 1
                    self.attempt += 1
                    continue
                self._finish(decision_action, reason)
                return
        except Exception as exc:
            _log.exception("job.crashed", job=self.spec.id)
            if self.group is not None:
                await self.group.stop(0)
            self._set(JobState.FAILED, f"internal error in the supervisor: {exc}")

    def _finish(self, action: Action, reason: str) -> None:
        if action is Action.SUCCEED:
            self._set(JobState.SUCCEEDED)
        elif action is Action.FAIL:
            self._set(JobState.FAILED, reason)
        elif action is Action.STOP and self._stop is not None:
            self._set(*self._stop)

    async def _supervise(self, group: WorkerGroup) -> tuple[Action, str]:
        seen: set[int] = set()
        stop_wait = asyncio.ensure_future(self._stop_requested.wait())
        try:
            while True:
                if not group.running:
                    exit_wait = None
                else:
                    exit_wait = asyncio.ensure_future(group.next_exit())
                    await asyncio.wait({stop_wait, exit_wait}, return_when=asyncio.FIRST_COMPLETED)
                    exit_wait.cancel()
                if self._stop is not None:
                    return Action.STOP, self._stop[1]
                fresh = group.exited_unseen(seen)
                seen.update(w.launch.rank for w in fresh)
                codes = [w.exited.result() for w in fresh]
                decision = on_exits(codes, len(group.running), self.restarts, self.spec.max_restarts)
                if decision.action is Action.WAIT:
                    continue
                failed = [w for w in fresh if w.exited.result() != 0]
                if failed:
                    self._record_failure(min(failed, key=lambda w: w.launch.rank))
                    self._set(
                        JobState.RESTARTING if decision.action is Action.RESTART else self.state,
                        decision.reason,
                    )
                return decision.action, decision.reason
        finally:
            stop_wait.cancel()

    def _record_failure(self, worker: Worker) -> None:
        launch = worker.launch
        self.failure = WorkerFailure.from_exit(
            node=self._rt.node_id,
            attempt=self.attempt,
            rank=launch.rank,
            local_rank=launch.local_rank,
            returncode=worker.exited.result(),
            message=read_error_file(launch.error_file),
            tail=read_tail(launch.log_path),
        )
        _log.warning("worker.failed", job=self.spec.id, attempt=self.attempt, summary=self.failure.summary())

    # -- launching ----------------------------------------------------------------------------
    def _identity(self) -> tuple[int | None, int | None, tuple[int, ...] | None]:
        """Workers run as the submitter; only a root daemon needs (and is able) to switch."""
        if os.geteuid() != 0 or self.spec.uid == 0:
            return None, None, None
        try:
            groups = tuple(os.getgrouplist(pwd.getpwuid(self.spec.uid).pw_name, self.spec.gid))
        except KeyError:
            groups = (self.spec.gid,)
        return self.spec.uid, self.spec.gid, groups

    def _launch(self) -> WorkerGroup:
        spec = self.spec
        directory = attempt_dir(self._rt.log_dir, spec.id, self.attempt)
        directory.mkdir(parents=True, exist_ok=True)
        uid, gid, groups = self._identity()
        if uid is not None:
            for d in (directory.parent, directory):
                os.chown(d, uid, gid if gid is not None else -1)
        layout = WorldLayout(
            group_rank=0,
            group_world_size=1,
            rank_offset=0,
            world_size=spec.nproc_per_node,
            local_world_size=spec.nproc_per_node,
            master_addr="127.0.0.1",
            master_port=free_port(),
        )
        visible = self._rt.inventory.visible_devices(self.slots)
        launches = []
        for local_rank in range(spec.nproc_per_node):
            rank = layout.rank_offset + local_rank
            error_file = directory / f"rank_{rank}.error.json"
            error_file.unlink(missing_ok=True)
            env = worker_env(
                base=spec.env,
                layout=layout,
                local_rank=local_rank,
                run_id=spec.id,
                restart_count=self.restarts,
                max_restarts=spec.max_restarts,
                visible_devices=visible,
                error_file=str(error_file),
                owner=self._rt.node_id,
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
        group = WorkerGroup(launches, self._rt.reaper, spec.stop_grace_s)
        group.start()
        _log.info(
            "attempt.started",
            job=spec.id,
            attempt=self.attempt,
            world_size=layout.world_size,
            master_port=layout.master_port,
            pids=[w.pid for w in group.workers],
        )
        return group
