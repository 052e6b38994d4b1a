"""One job's goodput ledger on this node, fed as things happen: the thin side of ``goodput``.

The job's launcher on this node holds it from the job's admission to the agent's leaving, across
rounds (``jobs.launcher.ProcessLauncher``): it tells the launches, the attempt's watch tells the
first local rank's reports and a hang (``progress.watch``), the attempt's workers their stop
(``jobs.attempt.ProcessWorkers``). The agent publishes ``tally`` with the node's report, and the
ledger's ``Mark`` (``goodput.published``). ``Books`` keeps each job's past the agent's leaving, for the
next agent of the job here, and past a restart of the daemon from that mark (``resume``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from elasticd.progress.goodput import (
    Entered,
    Event,
    Hung,
    Launched,
    Ledger,
    Mark,
    Silence,
    Stepped,
    Stopped,
    Tally,
    apply,
    opened,
    resumed,
    seconds,
)
from elasticd.progress.protocol import PhaseReport, Report, StepReport


class Accounts:
    def __init__(self, submitted_at: float, clock: Callable[[], float]) -> None:
        self.ledger: Ledger = opened(submitted_at)
        self._clock = clock

    def _apply(self, event: Event) -> None:
        self.ledger = apply(self.ledger, event)

    def launched(self, restarts: int, silence: Silence | None = None) -> None:
        self._apply(Launched(self._clock(), restarts, silence))

    def reported(self, report: Report, step: int | None, now: float) -> None:
        """The first local rank's ``report``, after which its tracker is at ``step``."""
        match report:
            case StepReport() if step is not None:
                self._apply(Stepped(now, step))
            case PhaseReport(phase):
                self._apply(Entered(now, phase))

    def hung(self) -> None:
        self._apply(Hung(self._clock()))

    def stopped(self, failed: bool, at: float | None = None) -> None:
        """The workers stopped (``at``: when the last exited; now if not given). A report read
        after the exit is stamped later than it: the stop is never booked before what was seen."""
        when = self._clock() if at is None else at
        self._apply(Stopped(max(when, self.ledger.since), failed))

    def tally(self) -> Tally:
        """Where the time since submission went, as of now."""
        return seconds(self.ledger, self._clock())

    def settled(self) -> Tally:
        """The seconds no later event moves (a counter may take these: they only ever grow)."""
        return self.ledger.tally


class Books:
    """This node's jobs' ledgers, kept past an agent's leaving: a node drained from a job and let
    back in (or lent for a scale-in and taken again) picks its ledger up where it stood, its last
    stop deciding the gap as a launch does, rather than starting over with all the time before
    counted as waiting (its report is overwritten by the new agent's). Bounded: the least recently
    used job's is forgotten first."""

    def __init__(self, most: int = 256) -> None:
        self._by_job: OrderedDict[str, Accounts] = OrderedDict()
        self._most = most

    def of(self, job: str, submitted_at: float, clock: Callable[[], float]) -> Accounts:
        accounts = self._by_job.pop(job, None) or Accounts(submitted_at, clock)
        return self._keep(job, accounts)

    def holds(self, job: str) -> bool:
        return job in self._by_job

    def resume(
        self, job: str, submitted_at: float, clock: Callable[[], float], mark: Mark, written_at: float
    ) -> Accounts:
        """The job's ledger picked up from ``mark``, this node's report of it written at
        ``written_at`` by a daemon before this one (``goodput.resumed``); one held already is
        kept (it is newer)."""
        if job in self._by_job:
            return self.of(job, submitted_at, clock)
        accounts = Accounts(submitted_at, clock)
        accounts.ledger = resumed(submitted_at, mark, written_at, clock())
        return self._keep(job, accounts)

    def _keep(self, job: str, accounts: Accounts) -> Accounts:
        self._by_job[job] = accounts
        while len(self._by_job) > self._most:
            self._by_job.popitem(last=False)
        return accounts
