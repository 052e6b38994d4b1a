"""Every reply, as a ``TypedDict``: the daemon builds it, the CLI reads it, mypy checks both
against the same keys, and ``elasticd.decode`` can check a reply at run time.

No ``from __future__ import annotations`` here, on purpose: Python 3.11 computes a TypedDict's
``__required_keys__`` wrongly when its annotations are strings, and tests read those.
"""

from typing import Any, NotRequired, Required, TypedDict

from elasticd.wire.states import WaitsFor


class ErrorReply(TypedDict):
    """The ``error`` of a failed reply; clients decide on ``code`` (an ErrorCode value) only."""

    code: str
    message: str
    details: NotRequired[dict[str, Any]]


class FailedRankView(TypedDict):
    """Another rank that failed in the same round (``elasticd.terms.state.FailedRank``)."""

    rank: int
    local_rank: int
    exit_code: int | None
    signal: str | None
    message: str  # one line
    failed_at: float | None
    node: NotRequired[str]  # set when it ran on another node than the root cause


class FailureView(TypedDict):
    """The root cause: the first worker to fail (``elasticd.terms.state.WorkerFailure.to_json``)."""

    node: str
    attempt: int
    rank: int
    local_rank: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    message: str
    output_tail: str
    oom: NotRequired[bool]  # this and the rest: absent in failures recorded by older daemons
    failed_at: NotRequired[float | None]  # its error file's timestamp, else when its exit was seen
    also_failed: NotRequired[list[FailedRankView]]  # the node's other failed ranks, first failed first
    also_failed_more: NotRequired[int]  # failed ranks beyond those listed
    kind: NotRequired[str]  # a FailureKind: user_code, oom, signal, hang, node_lost, gpu, infrastructure
    exception: NotRequired[str]  # the exception's type, when the output names one
    exited_at: NotRequired[float | None]
    step: NotRequired[int | None]  # the furthest step the failing node's ranks reported
    ran_s: NotRequired[float | None]  # how long the attempt ran before it failed
    frame: NotRequired[str]  # a hung rank's innermost frame, "train.py:42 in step"


class RankProgressView(TypedDict):
    """A rank's progress, as its node last published it (``elasticd.progress.tracker``)."""

    rank: int
    step: int | None  # the last step it reported; None: none yet (or it never reports)
    last_step_at: float | None  # when (its node's clock); "time since the last step" is now minus this
    steps_per_s: float | None
    step_time_s: float | None  # its median seconds per step, recently
    samples: int
    phase: str  # startup, step or checkpoint
    # Seconds outside collectives and waiting in them over the last 20 s (the daemon's looks at its
    # main thread); None until enough was seen.
    computing_s: float | None
    waiting_s: float | None
    queued_s: float | None  # of computing_s, waiting for a CPU: its node's ranks' mean (None: not said)
    evidence_at: float | None  # when that window ends (the same 5 s boundary on every node)
    score: float | None  # slowness: 1.0 as fast as the job's fastest rank, lower is slower (None: unscored)
    straggler: bool  # the job's judge names it a straggler (elasticd.progress.slowness.judge)


class MemberView(TypedDict):
    node: str
    address: str
    group_rank: int
    ranks: list[int]  # [first, last] global rank of the node's workers
    state: str  # the node's agent state, or GONE when it publishes none; a MemberEndState once ended
    devices: str
    pids: list[int]
    progress: NotRequired[list[RankProgressView]]  # its ranks' progress in this round, when published


class QueueView(TypedDict):
    """A waiting (PENDING) job's place in the fair queue (``elasticd.jobs.queue``)."""

    place: int  # 1: the next job considered when slots free up
    of: int  # jobs waiting in the queue
    why: str  # for people: its priority, its turn among its user's jobs, the slots its user holds


class InvalidRecordView(TypedDict):
    key: str
    why: str


class GoodputView(TypedDict):
    """Where a job's wall time since its submission went (``progress.goodput``), summed over its
    nodes' reports as their ranks saw it and scaled to ``wall_s``."""

    ratio: float | None  # productive seconds over wall_s
    wall_s: float  # submission to the end, or to the newest report
    by_cause_s: dict[str, float]  # per ``progress.goodput.Cause`` value: they add up to wall_s


class JobView(TypedDict):
    """One job, as ``submit``, ``status`` and ``kill`` show it (``elasticd.jobs.view.job_view``).

    Once the job has ended, ``world_size``, ``size``, ``members`` and ``master`` are its last
    round's, and each member's ``state`` is a ``MemberEndState``. ``members`` and ``nodes`` are
    given by ``status`` of one job (and ``kill``, ``logs``): the view of every job has the round's
    ``size`` alone (its members would cost every daemon O(N) bytes a round: ``manager/clustercopy.py``).

    When etcd cannot be reached, ``status`` of a job this node takes part in answers with this
    node's own view instead: ``stale`` is true and only ``id``, ``state``, ``reason``, ``round``,
    ``devices``, ``pids``, ``failure`` and ``updated_at`` are given.
    """

    id: str
    state: str  # a JobState value
    reason: str  # for people: never parse it (``waits_for`` and ``code`` are for programs)
    round: int
    attempt: int
    restarts: int
    world_size: int
    size: int  # nodes in the round (``members`` when read)
    members: list[MemberView]
    nodes: list[str]
    waiting_nodes: list[str]  # nodes that asked to join the running job at its next round
    node_states: dict[str, str]
    master: str  # host:port, "" before the first round closed
    devices: str  # this node's devices for the job
    pids: list[int]  # this node's live workers
    started_at: float | None  # round 0's close (else submitted_at, once that is deleted); None: never ran
    ended_at: float | None
    code: str | None  # an EndReason value once the job ended (or has an invalid record)
    waits_for: WaitsFor | None
    short_of_capacity: list[str]  # nodes allowed to take part that lack free slots now
    invalid_records: NotRequired[list[InvalidRecordView]]
    name: NotRequired[str]  # this and the rest up to ``allowed_nodes``: when the spec is readable
    user: NotRequired[str]
    max_restarts: NotRequired[int]
    nnodes: NotRequired[str]
    nproc_per_node: NotRequired[int]
    argv: NotRequired[list[str]]
    submitted_at: NotRequired[float]
    submitted_on: NotRequired[str]
    allowed_nodes: NotRequired[list[str]]
    failure: NotRequired[FailureView | None]
    cause: NotRequired[str | None]  # a FailureKind: what ended the job or opened its round; None: nothing
    error: NotRequired[str]  # FAILED jobs only
    stale: NotRequired[bool]
    updated_at: NotRequired[float]
    queue: NotRequired[QueueView]  # PENDING jobs only
    goodput: NotRequired[GoodputView]  # ``status`` of one job, once a node reported it


class JobReply(TypedDict):
    """``kill``, and ``status`` of one job."""

    job: JobView


ROW_REASON_CHARS = 60  # what a ``JobRow`` (and the table) shows of a job's error, else its reason


class QueueRow(TypedDict):
    """A waiting job's place in a ``JobRow``: ``QueueView`` without the why (``status JOB``)."""

    place: int
    of: int


class JobRow(TypedDict, total=False):
    """One job as the table of ``status`` shows it: a ``JobView``'s fields of the same names, each
    left out at its empty value (0, "", [], None), and ``reason``, the first ``ROW_REASON_CHARS``
    of the view's ``error``, else of its ``reason``."""

    id: Required[str]
    state: Required[str]
    user: str
    nodes: list[str]
    size: int
    world_size: int
    restarts: int
    max_restarts: int
    started_at: float
    ended_at: float
    reason: str
    queue: QueueRow


class StatusReply(TypedDict, total=False):
    """``status``: ``job`` when one was asked for, else ``jobs`` (oldest first), or ``rows`` (in the
    same order) when ``rows`` was asked for."""

    job: JobView
    jobs: list[JobView]
    rows: list[JobRow]


class LogChunk(TypedDict):
    attempt: int
    rank: int
    text: str  # whole lines, unless the job ended or ``partial`` was asked for


class RoundView(TypedDict):
    """The job's current round: why it was opened, and when it opened and closed."""

    round: int
    reason: str  # why it was opened: start, worker_failed, member_lost, scale_up or member_left
    detail: str  # for people: what happened (a failure's summary, the nodes that left or wait)
    spends_restart: bool  # a failure: it spent one of the job's restarts
    opened_at: float
    closed_at: float | None  # when its ranks were assigned; None while it is open


class LogsReply(TypedDict):
    chunks: list[LogChunk]
    cursor: dict[str, int]  # pass it back to get what follows
    state: str | None  # the job's JobState value
    node: str | None  # the node that answered: the logs are the ones it holds
    more: NotRequired[bool]  # this and the rest: absent from older daemons. More is there to read now
    job: NotRequired[JobView]  # the job, as ``status`` shows it
    round_info: NotRequired[RoundView | None]  # None when the job's round record cannot be read
    attempt_started_at: NotRequired[dict[str, float]]  # attempts with logs here, and when each started
    finishing_here: NotRequired[bool]  # this node still winds its part up (the keeper's last writes)


class MigView(TypedDict):
    uuid: str
    name: str
    memory_mib: int


class GpuView(TypedDict):
    index: int
    uuid: str
    name: str
    memory_mib: int
    bus_id: str
    cpus: list[int]
    mig: list[MigView]


class InventoryView(TypedDict):
    kind: str
    slots: int
    gpus: list[GpuView]


class GpuStateView(TypedDict):
    """One GPU's health and use (``elasticd.node.registry.GpuState``)."""

    uuid: str
    state: str  # healthy, unhealthy
    reason: str
    memory_used_mib: int | None
    utilization_pct: int | None
    job: str | None
    rank: int | None


class NodeView(TypedDict):
    """A live node (``elasticd.node.registry.NodeRecord.to_json``)."""

    node: str
    slots: int
    host: str
    version: str
    address: str
    inventory: InventoryView
    free_slots: int
    free_devices: str
    jobs: list[str]
    draining: bool
    gpu_states: list[GpuStateView]
    snapshot_bytes: int  # the bound on each job's memory snapshots there (0: off)
    snapshot_source: str  # derived (from its RAM and /dev/shm), set (snapshot_bytes), "": older daemon
    port_filter: NotRequired[str]  # "on" or "off"; absent or "": an older daemon
    port_filter_detail: NotRequired[str]  # on: the identity it filters by ("uid"); off: why


class EtcdSpaceView(TypedDict):
    """How full etcd is, as this daemon last read it (``elasticd.etcd.space.Space.to_json``)."""

    level: str  # unknown, ok, high (new submits refused), full (an alarm is raised)
    db_size: int | None  # bytes of the database file (None: etcd did not say)
    db_size_in_use: int | None
    quota_bytes: int  # the setting etcd_quota_bytes
    high_water_bytes: int  # new jobs are refused above it: etcd_high_water of the quota
    alarms: list[str]  # NOSPACE, CORRUPT
    read_at: float  # 0: never read


class NodesReply(TypedDict):
    nodes: list[NodeView]
    etcd: NotRequired[EtcdSpaceView]  # absent from older daemons


class CheckRow(TypedDict):
    """One node's figures in a ``check``: compute (iterations a second of a fixed loop on one
    core), and the asking node's link to it (round trip, bulk rate; none for the asking node)."""

    node: str
    compute: float | None
    rtt_s: float | None
    bytes_per_s: float | None
    error: str  # why it has no figures ("": none)
    verdict: str  # "ok", or why it is far below the others (rendezvous.fitness)


class CheckFigures(TypedDict):
    compute: float | None  # the checked nodes' medians
    rtt_s: float | None
    bytes_per_s: float | None


class Returned(TypedDict):
    node: str
    job: str


class CheckReply(TypedDict):
    nodes: list[CheckRow]
    cluster: CheckFigures
    measured_from: str  # the node whose links to the others were measured (the one asked)
    returned: list[Returned]  # nodes that passed, back in the jobs whose straggler policy drained them


class RmReply(TypedDict):
    job: str
    logs_removed: bool  # this node held logs of the job (other nodes drop theirs on their own)


class DrainReply(TypedDict):
    node: str
    job: str | None
    jobs: list[str]  # running jobs the node leaves
    forced: bool  # some job went below its minimum (``force``)


class UndrainReply(TypedDict):
    node: str
    job: str | None
    gpu: NotRequired[str]


class CallerView(TypedDict):
    uid: int
    gid: int
    user: str


class PingReply(TypedDict):
    node: str
    version: str
    pid: int
    uptime_s: float
    etcd: list[str]
    embedded_etcd: bool
    you: CallerView


class Encoded:
    """A result already encoded as JSON, which ``encode_ok`` puts in the reply as it is: ``status``
    of every job sends each job's view as it encoded it when the job last changed, instead of
    encoding a thousand views at every call. Given in pieces (``parts``, whose concatenation is
    the JSON), which the reply joins once: with a thousand jobs the reply is ~1 MB, and every
    concatenation on its way would copy all of it."""

    __slots__ = ("parts",)

    def __init__(self, *parts: bytes) -> None:
        self.parts = parts
