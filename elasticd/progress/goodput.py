"""Goodput: where a job's wall time went on one node, from its submission on. Pure: every event
carries its time.

The ledger is a fold over what the node saw (``Event``: its workers launched, a step or a phase
reported by its first local rank, a hang named, its workers stopped) that puts every second since
the job's submission in exactly one ``Cause``. Seconds whose cause a later event decides (the work
of the step in flight, the time since workers stopped for no failure of ours) wait in
``pending_s``; ``seconds`` says where everything would go if nothing more happened. The state is
a few numbers whatever the job's length, so a node can keep it across rounds and publish it with
its report; ``Tally`` is what crosses etcd, validated when read back.

- productive: steps run for the first time (the progress that was kept);
- redone: steps run again after a restore (a step number at or below the highest reached);
- restart: from a failure (ours or a peer's: the next launch spends a restart) to the first step
  after it, the lost step in flight included;
- checkpoint: in the checkpoint phase (memory snapshots included);
- waiting: queued, waiting for nodes or a rendezvous (before the first launch, or after a stop
  that spent no restart: a drain, a scale-up);
- hung: a hang, from the last report to its detection; on the other nodes of its round (blocked
  by it), from when its rank went silent to when the round moved on (``Silence``);
- startup: a launch that followed no failure, to the first step.

A daemon that restarts keeps nothing in memory: its node's report carries a ``Mark`` (the
settled seconds, the highest step, the restarts at the last launch), and the job's ledger picks
up from it when the node takes part again (``resumed``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from typing import Any, assert_never

from elasticd.decode import decode
from elasticd.progress.protocol import MAX_STEP, Phase

MAX_S = 1e10  # a bound on every figure read back (over 300 years): etcd is not trusted


class Cause(StrEnum):
    PRODUCTIVE = "productive"
    REDONE = "redone"
    RESTART = "restart"
    CHECKPOINT = "checkpoint"
    WAITING = "waiting"
    HUNG = "hung"
    STARTUP = "startup"


LOSSES = tuple(c for c in Cause if c is not Cause.PRODUCTIVE)


@dataclass(frozen=True)
class Tally:
    """Seconds per cause (``reports/<job>/<node>``'s ``goodput``)."""

    productive_s: float = 0.0
    redone_s: float = 0.0
    restart_s: float = 0.0
    checkpoint_s: float = 0.0
    waiting_s: float = 0.0
    hung_s: float = 0.0
    startup_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and 0 <= value <= MAX_S):
                raise ValueError(f"{f.name} must be 0..{MAX_S:g} seconds")

    def of(self, cause: Cause) -> float:
        return float(getattr(self, f"{cause.value}_s"))

    def add(self, cause: Cause, seconds: float) -> Tally:
        if seconds <= 0:
            return self
        key = f"{cause.value}_s"
        return replace(self, **{key: min(MAX_S, getattr(self, key) + seconds)})

    @property
    def total_s(self) -> float:
        return sum(self.of(c) for c in Cause)

    @property
    def ratio(self) -> float | None:
        """Goodput: the productive share of the time (None: no time yet)."""
        total = self.total_s
        return self.productive_s / total if total > 0 else None

    def losses(self) -> list[tuple[Cause, float]]:
        """The causes of lost time, the largest first (none of zero seconds)."""
        lost = [(c, self.of(c)) for c in LOSSES if self.of(c) > 0]
        return sorted(lost, key=lambda item: -item[1])

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Tally:
        return decode(cls, data)


def combine(parts: list[tuple[Tally, int]], wall_s: float) -> Tally:
    """A job's tally from its nodes' (each with its ranks): every node's shares weighted by its
    ranks' seconds, scaled to the job's wall time, so the causes add up to ``wall_s`` whether or
    not a node took part from the start or published a moment ago."""
    weight = sum(t.total_s * ranks for t, ranks in parts)
    if weight <= 0 or wall_s <= 0:
        return Tally()
    scale = min(MAX_S, wall_s) / weight
    out = Tally()
    for cause in Cause:
        out = out.add(cause, sum(t.of(cause) * ranks for t, ranks in parts) * scale)
    return out


class Mode(StrEnum):
    """Where the open interval's seconds go.

    WAITING -> STARTUP | RESTART      ``Launched`` (RESTART when a restart was spent since the last)
    STARTUP | RESTART -> STEPPING     the first ``Stepped``
    STEPPING <-> CHECKPOINT           ``Entered`` checkpoint / step (or a step reported)
    STARTUP | STEPPING | CHECKPOINT -> STOPPED
                                      ``Stopped``, no failure of ours (the next launch says why)
    any launched -> RESTART           ``Hung``, or ``Stopped`` after our own workers failed
    STOPPED -> STARTUP | RESTART      ``Launched``
    """

    WAITING = "waiting"
    STARTUP = "startup"
    RESTART = "restart"
    STEPPING = "stepping"
    CHECKPOINT = "checkpoint"
    STOPPED = "stopped"


_RUNNING = (Mode.STARTUP, Mode.RESTART, Mode.STEPPING, Mode.CHECKPOINT)


@dataclass(frozen=True)
class Silence:
    """The hang that ended the round before a launch, as the next round's record says on every
    node: when the hung rank went silent (its failure's ``failed_at``) and when the round moved on
    (the next round's ``opened_at``). Times of other nodes' clocks: only their overlap with the
    time a launch decides counts (``_silent_s``)."""

    since: float
    until: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.since) and math.isfinite(self.until)):
            raise ValueError("a silence is between two times")


@dataclass(frozen=True)
class Launched:
    at: float
    restarts: int  # the job's restarts spent, as the round that launched says
    silence: Silence | None = None  # a hang opened that round: its time was hung here too


@dataclass(frozen=True)
class Stepped:
    at: float
    step: int  # the step the first local rank finished (the tracker's count)


@dataclass(frozen=True)
class Entered:
    at: float
    phase: Phase


@dataclass(frozen=True)
class Hung:
    at: float  # when the hang was named


@dataclass(frozen=True)
class Stopped:
    at: float
    failed: bool  # a worker of ours failed or hung


Event = Launched | Stepped | Entered | Hung | Stopped


@dataclass(frozen=True)
class Ledger:
    tally: Tally
    mode: Mode
    since: float  # the open interval's start
    pending_s: float = 0.0  # before ``since``, cause not decided yet (see the module's docstring)
    kept: int | None = None  # the highest step finished so far: at or below it, a step is redone
    last: int | None = None  # the last step finished in this launch
    restarts: int | None = None  # restarts spent at the last launch (None: never launched here)


def opened(submitted_at: float) -> Ledger:
    """A job's ledger on a node: waiting since its submission."""
    return Ledger(Tally(), Mode.WAITING, submitted_at)


def apply(ledger: Ledger, event: Event) -> Ledger:
    """The ledger after ``event`` (a time before the open interval's start counts as that start)."""
    at = max(event.at, ledger.since)
    match event:
        case Launched(_, restarts, silence):
            return _launched(ledger, at, restarts, silence)
        case Stepped(_, step):
            return _stepped(ledger, at, min(max(step, 0), MAX_STEP))
        case Entered(_, phase):
            return _entered(ledger, at, phase)
        case Hung():
            return _lost(ledger, at, Cause.HUNG) if ledger.mode in _RUNNING else ledger
        case Stopped(_, failed):
            return _stopped(ledger, at, failed)
        case _:
            assert_never(event)


def replay(submitted_at: float, events: list[Event]) -> Ledger:
    ledger = opened(submitted_at)
    for event in events:
        ledger = apply(ledger, event)
    return ledger


def _open_cause(mode: Mode) -> Cause:
    """Where the open interval goes for modes that decide it alone."""
    return {Mode.WAITING: Cause.WAITING, Mode.STARTUP: Cause.STARTUP, Mode.RESTART: Cause.RESTART,
            Mode.CHECKPOINT: Cause.CHECKPOINT}[mode]  # fmt: skip


def _work_cause(ledger: Ledger, step: int) -> tuple[Cause, float]:
    """How much of the work up to ``step`` was a redo: the share of its steps at or below ``kept``."""
    kept, last = ledger.kept, ledger.last
    if kept is None or (step > kept and (last is None or last >= kept)):
        return Cause.PRODUCTIVE, 0.0
    if step <= kept:
        return Cause.REDONE, 1.0
    assert last is not None  # step > kept > last
    return Cause.REDONE, (kept - last) / (step - last)


def _book_work(tally: Tally, ledger: Ledger, step: int, work: float) -> Tally:
    cause, share = _work_cause(ledger, step)
    return tally.add(cause, work * share).add(Cause.PRODUCTIVE, work * (1 - share))


def _stepped(ledger: Ledger, at: float, step: int) -> Ledger:
    opened_s = at - ledger.since
    tally, work = ledger.tally, ledger.pending_s
    if ledger.mode is Mode.STEPPING:
        work += opened_s
    elif ledger.mode in (Mode.WAITING, Mode.STOPPED):  # a report from workers already stopped
        return ledger
    else:
        tally = tally.add(_open_cause(ledger.mode), opened_s)
    tally = _book_work(tally, ledger, step, work)
    kept = step if ledger.kept is None else max(ledger.kept, step)
    return replace(ledger, tally=tally, mode=Mode.STEPPING, since=at, pending_s=0.0, kept=kept, last=step)


def _entered(ledger: Ledger, at: float, phase: Phase) -> Ledger:
    mode, opened_s = ledger.mode, at - ledger.since
    if phase is Phase.CHECKPOINT and mode is Mode.STEPPING:
        return replace(ledger, mode=Mode.CHECKPOINT, since=at, pending_s=ledger.pending_s + opened_s)
    if phase is Phase.CHECKPOINT and mode in (Mode.STARTUP, Mode.RESTART):
        tally = ledger.tally.add(_open_cause(mode), opened_s)
        return replace(ledger, tally=tally, mode=Mode.CHECKPOINT, since=at)
    if phase is Phase.STEP and mode is Mode.CHECKPOINT:
        tally = ledger.tally.add(Cause.CHECKPOINT, opened_s)
        return replace(ledger, tally=tally, mode=Mode.STEPPING, since=at)
    return ledger


def _lost(ledger: Ledger, at: float, cause: Cause) -> Ledger:
    """Everything undecided and open goes to ``cause``; a restart runs from ``at``."""
    tally = ledger.tally.add(cause, ledger.pending_s + at - ledger.since)
    return replace(ledger, tally=tally, mode=Mode.RESTART, since=at, pending_s=0.0)


def _stopped(ledger: Ledger, at: float, failed: bool) -> Ledger:
    mode = ledger.mode
    if mode not in (Mode.STARTUP, Mode.STEPPING, Mode.CHECKPOINT):
        return ledger  # not running, or already restarting
    if failed:
        return _lost(ledger, at, Cause.RESTART)
    return replace(ledger, mode=Mode.STOPPED, since=at, pending_s=ledger.pending_s + at - ledger.since)


def _silent_s(ledger: Ledger, at: float, silence: Silence | None) -> float:
    """The seconds of the time a launch at ``at`` decides that the round's hang took: their
    overlap with ``silence``. They are taken as the last ones before ``at`` (they are, but for a
    checkpoint between the last step and the stop, whose seconds are booked already)."""
    if silence is None:
        return 0.0
    undecided = ledger.pending_s + at - ledger.since
    overlap = min(silence.until, at) - max(silence.since, ledger.since - ledger.pending_s)
    return min(max(0.0, overlap), undecided)


def _launched(ledger: Ledger, at: float, restarts: int, silence: Silence | None = None) -> Ledger:
    if ledger.mode in (Mode.STARTUP, Mode.STEPPING, Mode.CHECKPOINT):  # never told of the stop
        ledger = _stopped(ledger, at, False)
    failure = ledger.mode is Mode.RESTART or (ledger.restarts is not None and restarts > ledger.restarts)
    gap = Cause.RESTART if failure else Cause.WAITING
    hung = _silent_s(ledger, at, silence)
    tally = ledger.tally.add(Cause.HUNG, hung).add(gap, ledger.pending_s + at - ledger.since - hung)
    mode = Mode.RESTART if failure else Mode.STARTUP
    return replace(ledger, tally=tally, mode=mode, since=at, pending_s=0.0, last=None, restarts=restarts)


def seconds(ledger: Ledger, now: float) -> Tally:
    """Where the time up to ``now`` went, if nothing more happened: the step in flight counts as
    its step would, the time since a stop as waiting."""
    opened_s, tally = max(now, ledger.since) - ledger.since, ledger.tally
    match ledger.mode:
        case Mode.STEPPING | Mode.CHECKPOINT:
            work = ledger.pending_s + (opened_s if ledger.mode is Mode.STEPPING else 0.0)
            next_step = 0 if ledger.last is None else ledger.last + 1
            tally = _book_work(tally, ledger, next_step, work)
            return tally.add(Cause.CHECKPOINT, opened_s if ledger.mode is Mode.CHECKPOINT else 0.0)
        case Mode.STOPPED:
            return tally.add(Cause.WAITING, ledger.pending_s + opened_s)
        case _:
            return tally.add(_open_cause(ledger.mode), opened_s)


MAX_RESTARTS = 10_000  # a job's restarts' bound (``JobSpec.max_restarts``)
SLACK_S = 1.0  # a mark's settled seconds may end this much after its report's time (float sums)


@dataclass(frozen=True)
class Mark:
    """What a node's report carries (``reports/<job>/<node>``'s ``ledger``) for the job's ledger
    there to pick up from after the node's daemon restarted (``resumed``): the settled seconds,
    the highest step finished, the restarts at the last launch, and whether the node was
    restarting from a failure of its own. Bounded: it is read back from etcd."""

    settled: Tally
    kept: int | None = None
    restarts: int | None = None
    restarting: bool = False

    def __post_init__(self) -> None:
        if self.kept is not None and not 0 <= self.kept <= MAX_STEP:
            raise ValueError(f"kept must be a step, 0..{MAX_STEP}")
        if self.restarts is not None and not 0 <= self.restarts <= MAX_RESTARTS:
            raise ValueError(f"restarts must be 0..{MAX_RESTARTS}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Mark:
        return decode(cls, data)


def marked(ledger: Ledger) -> Mark:
    return Mark(ledger.tally, ledger.kept, ledger.restarts, ledger.mode is Mode.RESTART)


def published(ledger: Ledger | None, now: float) -> dict[str, Any]:
    """What a node's report says of the job's ledger there: where the time went as of ``now``
    (``goodput``, what ``status`` sums) and what a restarted daemon picks up from (``ledger``)."""
    if ledger is None:
        return {"goodput": None, "ledger": None}
    return {"goodput": seconds(ledger, now).to_json(), "ledger": marked(ledger).to_json()}


def resumed(submitted_at: float, mark: Mark, written_at: float, now: float) -> Ledger:
    """The ledger of a daemon that restarted, picked up from ``mark`` (its node's report, written
    at ``written_at``): the settled seconds kept, and everything after them (the work after the
    last step, the time the daemon was down) undecided until the next launch, which books it as
    after any stop: restart when a restart was spent since the last launch here (the job restarted
    for the node's loss: the restarted daemon's recovery spends one, or its peers did), waiting
    when none was (the node was not running the job: it waited for a round, or was drained). A
    mark that cannot be this job's here (written before its submission, or settling more seconds
    than the job has had) is ignored: the ledger starts over."""
    horizon = submitted_at + mark.settled.total_s
    if written_at < submitted_at or horizon > min(now, written_at) + SLACK_S:
        return opened(submitted_at)
    mode = Mode.RESTART if mark.restarting else Mode.WAITING if mark.restarts is None else Mode.STOPPED
    return Ledger(mark.settled, mode, horizon, kept=mark.kept, restarts=mark.restarts)
