"""The progress line protocol: what a worker writes on its progress pipe. Pure.

Tiny and versionless, so a script in any language can speak it::

    step 12            the worker finished step 12 (any non-negative number below 10**18)
    step               one more step than the last one reported
    phase checkpoint   a checkpoint is being written (a phase with its own timeout)
    phase step         back to training steps

(from a shell: ``echo step 12 > "$ELASTICD_HEARTBEAT_FILE"``).

A line is at most ``MAX_LINE`` bytes with its newline. The other end is untrusted: anything else
(a longer line, another word, a second space, a non-digit) is junk, dropped and counted, and a
line that never ends is cut at ``MAX_LINE`` bytes and skipped up to its newline, so a worker can
never make the daemon hold more than ``MAX_LINE`` bytes of its output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

PROGRESS_FD_ENV = "ELASTICD_PROGRESS_FD"  # the pipe's write end, inherited by the worker
HEARTBEAT_FILE_ENV = "ELASTICD_HEARTBEAT_FILE"  # the same pipe as a file name, /dev/fd/<n>
MAX_LINE = 128
MAX_STEP = 10**18 - 1
_STEP = re.compile(rb"^step(?: (0|[1-9][0-9]{0,17}))?$")
_PHASE = re.compile(rb"^phase (checkpoint|step)$")


class Phase(StrEnum):
    """What a worker is doing, each with its own timeout (``timeouts``).

    STARTUP -> STEP        the first step report
    STARTUP -> CHECKPOINT  ``phase checkpoint`` before any step (a checkpoint at start)
    STEP <-> CHECKPOINT    ``phase checkpoint`` / ``phase step`` (or a step report)
    """

    STARTUP = "startup"
    STEP = "step"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class StepReport:
    step: int | None  # None: one more than the last


@dataclass(frozen=True)
class PhaseReport:
    phase: Phase


Report = StepReport | PhaseReport


def parse_line(line: bytes) -> Report | None:
    """One line without its newline; None when it is not a valid report."""
    if len(line) >= MAX_LINE:
        return None
    m = _STEP.match(line)
    if m is not None:
        return StepReport(None if m.group(1) is None else int(m.group(1)))
    m = _PHASE.match(line)
    if m is not None:
        return PhaseReport(Phase(m.group(1).decode()))
    return None


class LineSplitter:
    """Cuts a byte stream into reports; holds at most ``MAX_LINE`` bytes between calls."""

    def __init__(self) -> None:
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop up to its newline
        self.junk = 0  # lines dropped so far

    def feed(self, data: bytes) -> list[Report]:
        out: list[Report] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            line = data[start:nl]
            start = nl + 1
            if self._skipping:
                self._skipping, self._partial = False, b""
                continue
            whole = self._partial + line
            self._partial = b""
            report = parse_line(whole)
            if report is None:
                self.junk += 1
            else:
                out.append(report)
        rest = data[start:]
        if not self._skipping and rest:
            if len(self._partial) + len(rest) >= MAX_LINE:
                self._skipping, self._partial = True, b""
                self.junk += 1
            else:
                self._partial += rest
        return out
