"""One job's goodput ledger on this node, fed as things happen: the thin side of ``goodput``.

The job's launcher on this node holds it from the job's admission to the agent's leaving, across
rounds (``jobs.launcher.ProcessLauncher``): it tells the launches, the attempt's watch tells the
first local rank's reports and a hang (``progress.watch``), the attempt's workers their stop
(``jobs.launch.ProcessWorkers``). The agent publishes ``tally`` with the node's report.
``Books`` keeps each job's past the agent's leaving, for the next agent of the job here.
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
    Stepped,
    Stopped,
    Tally,
    apply,
    opened,
    seconds,
)
from elasticd.progress.protocol import PhaseReport, Report, StepReport


class Accounts:
    def __init__(self, submitted_at: float, clock: Callable[[], float]) -> None:
        self.ledger: Ledger = opened(submitted_at)
        self._clock = clock

    def _apply(self, event: Event) -> None:
        self.ledger = apply(self.ledger, event)

    def launched(self, restarts: int) -> None:
        self._apply(Launched(self._clock(), restarts))

    def reported(self, report: Report, step: int | None, now: float) -> None:
        """The first local rank's ``report``, after which its tracker is at ``step``."""
        match report:
            case StepReport() if step is not None:
                self._apply(Stepped(now, step))
            case PhaseReport(phase):
                self._apply(Entered(now, phase))

    def hung(self) -> None:
        self._apply(Hung(self._clock()))

    def stopped(self, failed: bool) -> None:
        self._apply(Stopped(self._clock(), failed))

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
        self._by_job[job] = accounts
        while len(self._by_job) > self._most:
            self._by_job.popitem(last=False)
        return accounts
