"""What the agent's executor needs of the node, as protocols: processes, the lease, time, its
sleep and wake-ups, the watches it opens and the probes it makes.

Real implementations: ``elasticd.jobs.launcher.ProcessLauncher`` (worker process trees),
``elasticd.node.registry.NodeRegistry`` (the lease), ``SystemClock``, ``EventAlarm``,
``elasticd.node.peers.PeerWatch``, ``elasticd.agent.joinwatch.JoinWatch``,
``elasticd.node.liveness.probe``. Tests pass fakes (``tests.agent_sim_node`` every one of them:
the simulation steps the shipped executor).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

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


class Alarm(Protocol):
    """How the agent's loop sleeps: until something it acts on happens, a worker exits, or a
    timeout."""

    def ring(self) -> None:
        """Something the agent acts on happened: the current sleep, or else the next, ends now."""
        ...

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, rung or not (a ring is kept for the next ``sleep``)."""
        ...

    async def sleep(self, timeout_s: float, exits: set[asyncio.Future[Any]]) -> None:
        """Until rung, one of ``exits`` completes, or ``timeout_s``; a ring is then spent."""
        ...


class EventAlarm:
    """``Alarm`` on the agent's event loop."""

    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        self._rung.set()

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def sleep(self, timeout_s: float, exits: set[asyncio.Future[Any]]) -> None:
        waiter: asyncio.Future[Any] = asyncio.ensure_future(self._rung.wait())
        try:
            await asyncio.wait({waiter, *exits}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        self._rung.clear()


class Peers(Protocol):
    """The daemons of our round's peers, watched while our workers run: one proven dead has its
    lease revoked, and the agent is woken."""

    def follow(self, round_no: int, peers: tuple[Member, ...]) -> None:
        """Watch exactly ``peers`` (empty: none), members of round ``round_no``."""
        ...

    def close(self) -> None: ...


class Joins(Protocol):
    """The joins of the round this node leads, as they arrive: each wakes the agent."""

    @property
    def round(self) -> int | None:
        """The round whose joins are followed now (None: none)."""
        ...

    async def follow(self, round_no: int | None) -> None:
        """Follow exactly round ``round_no``'s joins (None: none); EtcdUnavailable if the watch
        cannot be opened."""
        ...

    def close(self) -> None: ...


class Prober(Protocol):
    async def __call__(
        self, targets: Sequence[tuple[str, str, int]], timeout_s: float
    ) -> tuple[frozenset[str], frozenset[str]]:
        """Connect to each (node, host, liveness port), each for at most ``timeout_s``: (reached,
        unreached)."""
        ...
