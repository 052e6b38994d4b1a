"""What the agent's executor needs of the node, as protocols: processes, the lease, time.

Real implementations: ``elasticd.jobs.launcher.ProcessLauncher`` (worker process trees),
``elasticd.node.registry.NodeRegistry`` (the lease), ``SystemClock``. Tests pass fakes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from elasticd.jobs.agentstore import Offer
from elasticd.jobs.decider import Group
from elasticd.progress.goodput import Ledger, Silence
from elasticd.progress.tracker import RankProgress
from elasticd.rendezvous.fitness import CheckTarget, Link
from elasticd.rendezvous.model import Member, RoundHead
from elasticd.terms.spec import JobSpec


class Workers(Protocol):
    """This node's running worker group of one round."""

    def pids(self) -> list[int]:
        """The pids of the workers still running."""
        ...

    def pgids(self) -> list[int]:
        """Every worker's process group (a worker leads its own), for crash recovery."""
        ...

    def exits(self) -> set[asyncio.Future[int]]:
        """Futures that complete when a still-running worker exits."""
        ...

    def progress(self) -> list[RankProgress]:
        """Each local rank's progress, as its reports say (``elasticd.progress``)."""
        ...

    def observe(self, describe: bool) -> Group:
        """The group's outcome so far; with ``describe``, a failure is described (reads its logs)."""
        ...

    async def stop(self, grace_s: float) -> list[int]:
        """SIGTERM, ``grace_s``, SIGKILL, whole trees; the pids that would not die."""
        ...


class Launcher(Protocol):
    """One job's workers on this node, attempt after attempt."""

    def prepare(self, spec: JobSpec) -> None:
        """The job was admitted here: get ready to start its workers (a warm zygote: the node's
        parked one for identical jobs, or a new one)."""
        ...

    async def offer(self, round_no: int) -> Offer:
        """The port offered for ``MASTER_PORT`` in a join to ``round_no``, and whether a store host
        of the job listens there (``elasticd.jobs.agentstore``)."""
        ...

    async def check_links(self, targets: tuple[CheckTarget, ...]) -> dict[str, Link]:
        """As a round's leader (``--node-check``): the link to each joiner's check server."""
        ...

    def goodput(self) -> Ledger | None:
        """Where the job's time went on this node since its submission (``progress.goodput``),
        across its rounds; None before ``prepare``."""
        ...

    async def close(self) -> None:
        """The agent has left the job (its workers are stopped): release what ``prepare`` made (the
        zygote is offered to the node's pool)."""
        ...

    async def start(
        self,
        spec: JobSpec,
        result: RoundHead,
        member: Member,
        restarts: int,
        slots: tuple[int, ...],
        silence: Silence | None = None,
    ) -> Workers:
        """Start our workers of ``result``'s round; raises ``SetupFailure`` when they cannot start
        for a reason that is not the job's fault (paths, log tree, limits). ``silence``: the hang
        that opened the round (the job's goodput books its time as hung here too)."""
        ...


class Lease(Protocol):
    """This node's lease, as the registry keeps it."""

    @property
    def lease_id(self) -> int | None: ...

    def lease_valid(self) -> bool: ...

    async def alive(self, among: frozenset[str] | None = None) -> frozenset[str]:
        """The nodes of the job whose lease is alive, of ``among`` (None: all of them)."""
        ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds (records in the store carry wall-clock times)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()
