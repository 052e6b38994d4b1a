"""One attempt's progress and hang watch on this node: the thin I/O side of ``tracker`` and
``decider``.

It reads every local rank's progress pipe (always: progress shows in ``status``), and, when the
job has a hang timeout, samples once per ``TICK_S`` what the decider needs: the CPU time of ranks
that have not reported (a rank that reports is judged by its reports alone), and the stacks of
those that look stalled. Once the decider names hung ranks, it dumps the stacks of every local
rank into the attempt's log directory, describes the hang as a ``WorkerFailure`` (``kind`` hang)
and completes ``hung``; the group then reports FAILED and the normal failure path takes over
(the round moves, every member stops its workers). The watch never stops a worker itself.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from elasticd import log
from elasticd.happenings.bus import publish
from elasticd.happenings.records import WorkerHung
from elasticd.progress import slowness, stacks
from elasticd.progress.accounts import Accounts
from elasticd.progress.channel import ProgressChannel
from elasticd.progress.decider import (
    PEER_GRACE_S,
    CpuSample,
    Evidence,
    Hung,
    StackSample,
    decide,
    flat_since,
    held_for_peers,
    looks_stalled,
    root_cause,
)
from elasticd.progress.protocol import Phase, Report
from elasticd.progress.sampler import Dump, dump_stacks, tree_cpu_seconds
from elasticd.progress.threadstate import ActivitySampler
from elasticd.progress.timeouts import HangPolicy, TimeoutLearner
from elasticd.progress.tracker import RankProgress, RankTracker
from elasticd.terms.state import FailedRank, FailureKind, WorkerFailure
from elasticd.workers.proctree.spawn import Identity

_log = log.get("elasticd.progress")

TICK_S = 0.5  # a rank is judged at most this long after its evidence spans the timeout
MAX_SAMPLES = 1024  # per rank: samples are thinned to span the longest timeout


@dataclass(frozen=True)
class WatchedRank:
    rank: int
    local_rank: int
    channel: ProgressChannel


class _Rank:
    def __init__(
        self,
        spec: WatchedRank,
        pid: int | None,
        alive: Callable[[], bool],
        started_at: float,
        learner: TimeoutLearner,
    ) -> None:
        self.spec = spec
        self.pid = pid
        self._alive = alive
        self.tracker = RankTracker(spec.rank, started_at, learner.observe)
        self.cpu: deque[CpuSample] = deque(maxlen=MAX_SAMPLES)
        self.stacks: deque[StackSample] = deque(maxlen=MAX_SAMPLES)
        self.stacks_error = ""

    @property
    def running(self) -> bool:
        return self.pid is not None and self._alive()

    def evidence(self) -> Evidence:
        return Evidence(
            rank=self.spec.rank,
            phase=self.tracker.phase,
            last_report_at=self.tracker.last_report_at,
            cpu=tuple(self.cpu),
            stacks=tuple(self.stacks),
            stacks_available=not self.stacks_error,
        )


class HangWatch:
    def __init__(
        self,
        ranks: list[WatchedRank],
        policy: HangPolicy | None,
        identity: Identity | None,
        job: str,
        node: str,
        attempt: int,
        write_stacks: Callable[[int, str], None],
        clock: Callable[[], float],
        elsewhere: bool = False,
        accounts: Accounts | None = None,
    ) -> None:
        """``write_stacks(rank, text)`` writes a rank's stacks file (``jobs.stackfile.write_stacks``);
        ``elsewhere``: the round has ranks on other nodes too; ``accounts``: the job's goodput here,
        told the first local rank's reports and the hang."""
        self._specs = ranks
        self._policy = policy
        self._identity = identity
        self._job = job
        self._node = node
        self._attempt = attempt
        self._write_stacks = write_stacks
        self._clock = clock
        self._elsewhere = elsewhere
        self._accounts = accounts
        self._held_since: float | None = None  # the first tick that held a hang back for the peers
        self._learner = TimeoutLearner(policy or HangPolicy(None))
        self._ranks: list[_Rank] = []
        self._task: asyncio.Task[None] | None = None
        self._activity: ActivitySampler | None = None
        self.hung: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.failure: WorkerFailure | None = None

    def attach(self, procs: list[tuple[int | None, Callable[[], bool]]]) -> None:
        """The workers started: (pid, whether it still runs) in the order of ``ranks``; a pid of
        None: it never started."""
        now = self._clock()
        for spec, (pid, alive) in zip(self._specs, procs, strict=True):
            rank = _Rank(spec, pid, alive, now, self._learner)
            self._ranks.append(rank)
            spec.channel.start(self._reporter(rank))
        started = [(s.rank, pid) for s, (pid, _) in zip(self._specs, procs, strict=True) if pid is not None]
        self._activity = ActivitySampler(started, self._clock)
        self._activity.start()
        if self._policy is not None:
            self._task = asyncio.create_task(self._run(), name=f"hang-watch-{self._attempt}")

    def _reporter(self, rank: _Rank) -> Callable[[Report], None]:
        return lambda report: self._report(rank, report)

    def _report(self, rank: _Rank, report: Report) -> None:
        now = self._clock()
        rank.tracker.report(report, now)
        if self._accounts is not None and rank is self._ranks[0]:
            self._accounts.reported(report, rank.tracker.step, now)
        rank.stacks.clear()  # it moves: older stacks say nothing about now

    def progress(self) -> list[RankProgress]:
        until, seen = self._activity.evidence_all() if self._activity is not None else (0.0, {})
        return [_with_evidence(r.tracker.snapshot(), seen.get(r.spec.rank), until) for r in self._ranks]

    def junk(self) -> int:
        return sum(r.spec.channel.junk for r in self._ranks)

    def drain(self) -> None:
        """Take every report already written, now (the workers exited: nothing more comes)."""
        for spec in self._specs:
            spec.channel.drain()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._activity is not None:
            self._activity.close()
        for spec in self._specs:
            ch = spec.channel
            if ch.junk or ch.pauses:
                _log.info(
                    "progress.junk", job=self._job, attempt=self._attempt, rank=spec.rank, lines=ch.junk,
                    pauses=ch.pauses,
                )  # fmt: skip
            ch.close()

    # -- the watch -----------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while self.failure is None:
                await asyncio.sleep(TICK_S)
                await self._tick()
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("hang_watch.crashed", attempt=self._attempt)

    def _timeouts(self) -> dict[Phase, float]:
        return self._learner.timeouts()

    async def _tick(self) -> None:
        watched = [r for r in self._ranks if r.running and r.pid is not None]
        quiet = [r for r in watched if r.tracker.last_report_at is None]
        if quiet:
            cpu = await asyncio.to_thread(lambda: [tree_cpu_seconds(r.pid or 0) for r in quiet])
            now = self._clock()
            longest = max(self._timeouts().values())
            for r, used in zip(quiet, cpu, strict=True):
                if used is not None:
                    _add(r.cpu, CpuSample(now, used), longest)
            await self._sample_stacks(quiet, now)
        now = self._clock()
        hung = decide([r.evidence() for r in watched], self._timeouts(), now)
        if hung:
            await self._declare(hung, now)
        else:
            self._held_since = None

    async def _sample_stacks(self, quiet: list[_Rank], now: float) -> None:
        timeouts = self._timeouts()
        for r in quiet:
            if r.stacks_error or r.pid is None:
                continue
            if not looks_stalled(r.cpu):
                r.stacks.clear()
                continue
            timeout = timeouts[r.tracker.phase]
            every = min(30.0, max(TICK_S, timeout / 5))
            last = r.stacks[-1].at if r.stacks else None
            due = last is None or now - last >= every
            # About to be judged: a fresh sample, so the stacks span the whole timeout.
            closing = last is not None and flat_since(r.cpu, now, timeout) is not None and now - last >= 0.5
            if not (due or closing):
                continue
            dump = await dump_stacks(r.pid, self._identity)
            if dump.threads is None:
                r.stacks_error = dump.error
                _log.warning("hang_watch.no_stacks", rank=r.spec.rank, why=dump.error)
                continue
            main = stacks.main_thread(dump.threads, r.pid)
            _add(r.stacks, StackSample(self._clock(), stacks.digest(main), stacks.innermost(main)), timeout)

    async def _declare(self, hung: list[Hung], now: float) -> None:
        """Dump every local rank's stacks, name the likely cause, and report the hang (or hold it
        back a little for the other nodes: ``decider.held_for_peers``)."""
        running = [r for r in self._ranks if r.running and r.pid is not None]
        by_rank, waiting, frames = await self._look(running, hung)
        alive = {r.spec.rank for r in running if r.running}  # the look takes a while: some may be gone
        hung = [h for h in hung if h.rank in alive]
        if not hung:
            return  # they exited meanwhile: their exits speak
        if held_for_peers(hung, waiting, self._elsewhere, self._held_since, now):
            if self._held_since is None:
                self._held_since = now
                _log.info(
                    "hang_watch.held", job=self._job, attempt=self._attempt, ranks=[h.rank for h in hung],
                    grace_s=PEER_GRACE_S,
                )  # fmt: skip
            return
        for r in running:
            self._save(r, by_rank[r.spec.rank])
        ordered = root_cause(hung, waiting)
        first, others = ordered[0], ordered[1:]
        local = {r.spec.rank: r.spec.local_rank for r in self._ranks}
        frame = frames.get(first.rank, first.frame)
        no_stacks = _why(by_rank, first.rank)
        self.failure = WorkerFailure(
            node=self._node,
            attempt=self._attempt,
            rank=first.rank,
            local_rank=local[first.rank],
            exit_code=None,
            signal=None,
            message=hang_message(first, frame, no_stacks),
            output_tail="",
            failed_at=first.since,  # when it went silent: across nodes, the first to go silent is blamed
            exited_at=first.since,
            also_failed=tuple(
                FailedRank(
                    rank=h.rank,
                    local_rank=local[h.rank],
                    exit_code=None,
                    signal=None,
                    message=hang_message(
                        h, frames.get(h.rank, h.frame), by_rank.get(h.rank, Dump(None)).error
                    ),
                    failed_at=h.since,
                )
                for h in others[:8]
            ),
            also_failed_more=max(0, len(others) - 8),
            kind=FailureKind.HANG,
            frame=frame,
        )
        publish(WorkerHung(self._job, self._attempt, first.rank, frame, round(first.silent_s, 1)))
        if self._accounts is not None:
            self._accounts.hung()
        if not self.hung.done():
            self.hung.set_result(first.rank)

    async def _look(
        self, running: list[_Rank], hung: list[Hung]
    ) -> tuple[dict[int, Dump], dict[int, bool], dict[int, str]]:
        """Every running rank's stacks, by rank: the dump, whether its main thread waits in a
        collective, and its innermost frame (the decider's, when the dump has none)."""
        dumps = await asyncio.gather(*(dump_stacks(r.pid or 0, self._identity) for r in running))
        by_rank = {r.spec.rank: dump for r, dump in zip(running, dumps, strict=True)}
        hung_frames = {h.rank: h.frame for h in hung}
        waiting: dict[int, bool] = {}
        frames: dict[int, str] = {}
        for r in running:
            dump = by_rank[r.spec.rank]
            main = stacks.main_thread(dump.threads, r.pid or 0) if dump.threads else None
            waiting[r.spec.rank] = stacks.in_collective(main)
            frames[r.spec.rank] = stacks.innermost(main) or hung_frames.get(r.spec.rank, "")
        return by_rank, waiting, frames

    def _save(self, r: _Rank, dump: Dump) -> None:
        text = (
            stacks.render(r.spec.rank, r.pid or 0, dump.threads)
            if dump.threads is not None
            else f"rank {r.spec.rank}, process {r.pid}: stacks unavailable: {dump.error}\n"
        )
        try:
            self._write_stacks(r.spec.rank, text)
        except Exception as exc:  # the hang is reported all the same
            _log.warning("hang_watch.stacks_unwritten", rank=r.spec.rank, error=str(exc))


def hang_message(h: Hung, frame: str, no_stacks: str = "") -> str:
    """``rank 3 hung: no progress for 30 s in train.py:42 in step``."""
    where = f" in {frame}" if frame else (f" (stacks unavailable: {no_stacks})" if no_stacks else "")
    return f"rank {h.rank} hung: no progress for {h.silent_s:.0f} s{where}"


def _why(dumps: dict[int, Dump], rank: int) -> str:
    dump = dumps.get(rank)
    return dump.error if dump is not None else ""


def _add(
    samples: deque[CpuSample] | deque[StackSample], sample: CpuSample | StackSample, span: float
) -> None:
    """Keep samples no closer than ``span / MAX_SAMPLES``: the window always covers ``span``."""
    if len(samples) >= 2 and sample.at - samples[-2].at < span / MAX_SAMPLES:
        samples.pop()  # the newest is always kept; older ones stay spaced out
    samples.append(sample)  # type: ignore[arg-type]


def _with_evidence(p: RankProgress, seen: slowness.Evidence | None, until: float) -> RankProgress:
    if seen is None:
        return p
    return replace(
        p,
        computing_s=seen.computing_s,
        waiting_s=seen.waiting_s,
        queued_s=seen.queued_s,
        evidence_at=until,
    )
