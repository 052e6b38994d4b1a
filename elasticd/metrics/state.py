"""The gauges read from the daemon's state when Prometheus scrapes, not counted as things happen.

``gather`` takes one look at the daemon (its agents, their workers' progress, the registry, and
one read of the cluster's jobs and nodes, as ``status`` and ``nodes`` make) into a frozen
``NodeState``; ``StateCollector`` renders the last look. The scrape handler gathers first, on the
daemon's loop, then renders: prometheus_client's ``collect`` is synchronous and must not block.

Jobs by state and the node count are the cluster's, as this node reads them: every node reports
the same values, so aggregate them with ``max`` (not ``sum``) across nodes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.agent.record import AgentState
from elasticd.errors import EtcdUnavailable
from elasticd.etcd.space import Space, SpaceLevel
from elasticd.jobs.view import job_state
from elasticd.progress.goodput import LOSSES, Tally
from elasticd.progress.slowness import Evidence
from elasticd.terms.state import GpuStatus, JobState

if TYPE_CHECKING:
    from elasticd.manager.jobmanager import JobManager
    from elasticd.node.registry import NodeRegistry


@dataclass(frozen=True)
class NodeState:
    node: str
    etcd_up: bool = True
    jobs: dict[str, int] = field(default_factory=dict)  # JobState value -> jobs (cluster-wide)
    nodes: int = 0  # live nodes (cluster-wide)
    nodes_draining: int = 0
    groups: dict[str, int] = field(default_factory=dict)  # AgentState value -> this node's jobs
    workers: dict[str, int] = field(default_factory=dict)  # job -> live worker processes here
    steps_per_s: dict[str, float] = field(default_factory=dict)  # job -> its ranks' here, summed
    step_times: dict[tuple[str, int], float] = field(default_factory=dict)  # (job, rank) -> median step s
    evidence: dict[tuple[str, int], Evidence] = field(default_factory=dict)  # this node's ranks
    scores: dict[tuple[str, int], float] = field(default_factory=dict)  # every rank of the rounds judged here
    slots: int = 0
    free_slots: int = 0
    lease_renewals: int = 0
    lease_held: bool = False
    etcd_space: Space | None = None  # how full etcd is, as last read (None: not watched)
    gpus: tuple[dict[str, Any], ...] = ()  # each GPU's state and use (``GpuPool.states``), in index order
    goodput: dict[str, tuple[Tally, Tally]] = field(default_factory=dict)  # job -> now, settled (here)


async def gather(manager: JobManager, registry: NodeRegistry, space: Space | None = None) -> NodeState:
    """One look at the daemon (reads etcd twice, in threads); ``space``: the last reading of how
    full etcd is (``SpaceWatch``: read every few seconds, not at the scrape)."""
    groups = Counter(agent.state.value for agent in manager.agents.values())
    workers: dict[str, int] = {}
    rates: dict[str, float] = {}
    step_times: dict[tuple[str, int], float] = {}
    evidence: dict[tuple[str, int], Evidence] = {}
    scores: dict[tuple[str, int], float] = {}
    goodput: dict[str, tuple[Tally, Tally]] = {}
    for job, agent in manager.agents.items():
        scores |= {(job, rank): score for rank, score in agent.straggler_scores().items()}
        if (tallies := agent.goodput()) is not None:
            goodput[job] = tallies
        if agent.workers is None:
            continue
        workers[job] = len(agent.workers.pids())
        progress = agent.workers.progress()
        if any(p.steps_per_s is not None for p in progress):
            rates[job] = sum(p.steps_per_s or 0.0 for p in progress)
        step_times |= {(job, p.rank): p.step_time_s for p in progress if p.step_time_s is not None}
        evidence |= {(job, p.rank): e for p in progress if (e := p.evidence) is not None}
    capacity = manager.capacity()
    local = NodeState(
        node=registry.node_id,
        groups={s.value: groups.get(s.value, 0) for s in AgentState},
        workers=workers,
        steps_per_s=rates,
        step_times=step_times,
        evidence=evidence,
        scores=scores,
        slots=int(capacity["slots"]),
        free_slots=int(capacity["free_slots"]),
        lease_renewals=registry.renewals,
        lease_held=registry.lease_id is not None,
        etcd_space=space,
        goodput=goodput,
        gpus=tuple(manager.gpus.states({j: a.first_rank for j, a in manager.agents.items()}, coarse=False)),
    )
    try:
        reads, records = await asyncio.gather(manager.cluster.current(), asyncio.to_thread(registry.records))
    except EtcdUnavailable:
        return replace(local, etcd_up=False)
    states = Counter(job_state(s).value for s in reads.values())
    return replace(
        local,
        jobs={s.value: states.get(s.value, 0) for s in JobState},
        nodes=len(records),
        nodes_draining=sum(1 for r in records if r.draining),
    )


class StateCollector(Collector):
    """Renders the last ``NodeState`` it was given (``update``)."""

    def __init__(self) -> None:
        self.state: NodeState | None = None

    def update(self, state: NodeState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []  # families are built per scrape: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        s = self.state
        if s is None:
            return
        yield _gauge("elasticd_etcd_up", "Whether this node could read etcd at the scrape", int(s.etcd_up))
        if s.etcd_up:
            yield _by(
                "elasticd_jobs", "Jobs in the cluster by state (the same on every node)", "state", s.jobs
            )
            yield _gauge("elasticd_nodes", "Live nodes in the cluster (the same on every node)", s.nodes)
            yield _gauge("elasticd_nodes_draining", "Live nodes that are drained", s.nodes_draining)
        yield _by(
            "elasticd_worker_groups",
            "This node's part in jobs (its worker group), by state",
            "state",
            s.groups,
        )
        yield _by("elasticd_worker_processes", "Live worker processes on this node, by job", "job", s.workers)
        yield _by(
            "elasticd_steps_per_second",
            "Training steps per second of this node's ranks, summed, by job (from their progress reports)",
            "job",
            s.steps_per_s,
        )
        yield _step_times(s.step_times)
        yield from _slowness(s.evidence, s.scores)
        yield _gauge("elasticd_slots", "This node's slots", s.slots)
        yield _gauge("elasticd_free_slots", "This node's free slots", s.free_slots)
        yield CounterMetricFamily(
            "elasticd_lease_renewals", "Keep-alives that renewed this node's lease", value=s.lease_renewals
        )
        yield _gauge("elasticd_lease_held", "Whether this node holds its lease", int(s.lease_held))
        if s.etcd_space is not None:
            yield from _space(s.etcd_space)
        if s.gpus:
            yield from _gpus(s.gpus)
        yield from _goodput(s.goodput)


def _goodput(goodput: Mapping[str, tuple[Tally, Tally]]) -> Iterator[Metric]:
    """This node's share of each job's time (``progress.goodput``); a job's figure is the sum over
    its nodes. The counter takes the settled seconds, which only ever grow."""
    ratio = GaugeMetricFamily(
        "elasticd_job_goodput_ratio",
        "Productive share of the time since submission, as this node's ranks saw it, by job",
        labels=["job"],
    )
    lost = CounterMetricFamily(
        "elasticd_job_lost_seconds",
        "Seconds since submission not spent on kept training, as this node saw them, by job and cause",
        labels=["job", "cause"],
    )
    for job, (now, settled) in sorted(goodput.items()):
        if now.ratio is not None:
            ratio.add_metric([job], now.ratio)
        for cause in LOSSES:
            lost.add_metric([job, cause.value], settled.of(cause))
    yield ratio
    yield lost


def _gpus(gpus: tuple[dict[str, Any], ...]) -> Iterator[Metric]:
    """Per GPU, labelled by its index and UUID: healthy or not, memory used, utilisation, and
    which job holds it (one sample per held GPU, value 1)."""
    labels = ["gpu", "uuid"]
    healthy = GaugeMetricFamily(
        "elasticd_gpu_healthy", "Whether the GPU is in the pool (1) or out as unhealthy (0)", labels=labels
    )
    memory = GaugeMetricFamily("elasticd_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=labels)
    util = GaugeMetricFamily(
        "elasticd_gpu_utilization_percent", "GPU utilisation over NVML's last sample period", labels=labels
    )
    held = GaugeMetricFamily(
        "elasticd_gpu_job", "The job holding the GPU (1), and the rank on it", labels=[*labels, "job", "rank"]
    )
    for i, g in enumerate(gpus):
        key = [str(i), str(g["uuid"])]
        healthy.add_metric(key, int(g["state"] == GpuStatus.HEALTHY))
        if g["memory_used_mib"] is not None:
            memory.add_metric(key, g["memory_used_mib"] * 1024 * 1024)
        if g["utilization_pct"] is not None:
            util.add_metric(key, g["utilization_pct"])
        if g["job"] is not None:
            held.add_metric([*key, str(g["job"]), "" if g["rank"] is None else str(g["rank"])], 1)
    yield from (healthy, memory, util, held)


def _step_times(times: Mapping[tuple[str, int], float]) -> GaugeMetricFamily:
    """Each of this node's ranks' median step time: in synchronous training the same on every rank,
    every node's ranks, says how fast the job steps, not which rank holds it back (``_slowness``)."""
    family = GaugeMetricFamily(
        "elasticd_rank_step_seconds",
        "Median seconds per step of each of this node's ranks, by job and rank (from their progress reports)",
        labels=["job", "rank"],
    )
    for (job, rank), took in sorted(times.items()):
        family.add_metric([job, str(rank)], took)
    return family


def _slowness(
    evidence: Mapping[tuple[str, int], Evidence], scores: Mapping[tuple[str, int], float]
) -> Iterator[Metric]:
    """Where each of this node's ranks spends its time (``progress.slowness``), and the score of
    every rank of the rounds this node judges (group rank 0's node: each rank once cluster-wide)."""
    labels = ["job", "rank"]
    computing = GaugeMetricFamily(
        "elasticd_rank_computing_seconds",
        "Seconds each of this node's ranks spent outside collectives over the last 20 s",
        labels=labels,
    )
    waiting = GaugeMetricFamily(
        "elasticd_rank_waiting_seconds",
        "Seconds each of this node's ranks spent waiting in collectives over the last 20 s",
        labels=labels,
    )
    queued = GaugeMetricFamily(
        "elasticd_rank_cpu_queued_seconds",
        "Of each of this node's ranks' computing seconds, those spent runnable but waiting for a CPU "
        "(the mean of its node's ranks: a loaded host, not a slow rank)",
        labels=labels,
    )
    for (job, rank), e in sorted(evidence.items()):
        computing.add_metric([job, str(rank)], e.computing_s)
        waiting.add_metric([job, str(rank)], e.waiting_s)
        queued.add_metric([job, str(rank)], e.queued_s)
    score = GaugeMetricFamily(
        "elasticd_rank_slowness_score",
        "Each rank's slowness score (1: as fast as the job's fastest rank; lower is slower)",
        labels=labels,
    )
    for (job, rank), value in sorted(scores.items()):
        score.add_metric([job, str(rank)], value)
    yield from (computing, waiting, queued, score)


def _space(space: Space) -> Iterator[Metric]:
    """How full etcd is: its database, the quota and mark, the level and the raised alarms."""
    yield _gauge(
        "elasticd_etcd_quota_bytes", "etcd's quota (the setting etcd_quota_bytes)", space.limits.quota_bytes
    )
    yield _gauge(
        "elasticd_etcd_high_water_bytes", "New jobs are refused above this database size", space.limits.mark
    )
    level = GaugeMetricFamily(
        "elasticd_etcd_space_level", "How full etcd is: 1 for the current level", labels=["level"]
    )
    for value in SpaceLevel:
        level.add_metric([value.value], int(value is space.level))
    yield level
    if (st := space.status) is None:
        return
    yield _gauge(
        "elasticd_etcd_db_size_bytes", "Size of etcd's database file (what its quota counts)", st.db_size
    )
    yield _gauge("elasticd_etcd_db_size_in_use_bytes", "Bytes of etcd's database in use", st.db_size_in_use)
    yield _by(
        "elasticd_etcd_alarm", "etcd's raised alarms (1 while raised)", "alarm", {a: 1 for a in st.alarms}
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _by(name: str, doc: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    """A gauge with one sample per ``label`` value, in a stable order."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family
