"""One trial of bench_multi (a scenario, one launcher), and the settings every trial shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.paths import REPO

WORKER = REPO / "bench" / "multi_worker.py"
EXAMPLE = REPO / "examples" / "elastic_train.py"
LEASE_TTL = 2  # the minimum the daemon accepts
DAEMON_STOP_GRACE_S = 5
DAEMON_SHUTDOWN_S = 20
MAX_RESTARTS = 5
WARM_S = 2.0  # loss: time at world 2 before the kill
DRAIN_AFTER_STEPS = 50  # drain: ledger lines at world 2 before the leave request
STEPS_AFTER_RESUME = 20  # drain: ledger lines at world 1 before the job is killed
TORCHRUN_RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"
POLL_S = 0.01
IDLE_END_S = 5.0  # drain, torchrun: the surviving agent ran no worker this long -> training ended


@dataclass
class Trial:
    scenario: str  # loss | drain
    variant: str  # loss: rank0 | other; drain: drain
    launcher: str
    index: int
    ok: bool = False  # produced a sample
    # loss: kill -> the survivor's first collective at world 1; drain: request -> first step at world 1
    value_s: float | None = None
    relaunch_s: float | None = None  # kill/request -> the survivor's new worker was launched
    detect_s: float | None = None  # elasticd: kill/request -> the survivor's daemon bumped the round
    survivor_exited: bool = False  # the surviving launcher (torchrun agent / elasticd daemon) exited
    job_ended: bool = False  # drain: the survivor stopped training too and nothing restarted it
    timed_out: bool = False
    steps_lost: int | None = None  # drain: ledger lines - distinct steps
    ledger_lines: int | None = None
    distinct_steps: int | None = None
    last_step_before: int | None = None  # drain: last step at world 2
    resume_step: int | None = None  # drain: first step at world 1
    worlds: list[int] = field(default_factory=list)  # drain: the world size of each ledger segment
    ranks: dict[str, str] = field(default_factory=dict)  # rank -> node, at world 2
    victim: str = ""  # node killed / drained
    victim_had_rank0: bool | None = None
    store_host: str = ""  # torchrun: the agent hosting the c10d store
    recovered_round: str = ""
    rounds_seen: list[str] = field(default_factory=list)
    request_s: float | None = None  # drain: how long `elasticctl drain` took
    job: str | None = None
    state: str | None = None
    restarts: int | None = None
    launcher_rc: dict[str, int | None] = field(default_factory=dict)
    # mean CPU (% of one core) over their lifetime, of the launcher processes alive at the end
    # (elasticd: each daemon; torchrun: each agent), and of the shared etcd during the trial
    launcher_cpu: dict[str, float] = field(default_factory=dict)
    etcd_cpu: float | None = None
    startup_s: float | None = None  # launch -> world 2 up (not a metric)
    wall_s: float | None = None
    leftovers_killed: list[str] = field(default_factory=list)
    error: str = ""

    def note(self, message: str) -> None:
        self.error = f"{self.error}; {message}" if self.error else message

    @property
    def outcome(self) -> str:
        if self.ok:
            return "ok"
        if self.survivor_exited:
            return "survivor-exited"
        if self.job_ended:
            return "job-ended"
        return "timeout" if self.timed_out else "error"
