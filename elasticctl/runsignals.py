"""What a stop signal does to ``elasticrun``, by how far it got with its job.

Pure: ``react`` takes where elasticrun is (``Stops``) and the signal's name, and returns where it is
then and what to do; ``elasticctl.run`` installs the handler that carries it out. The first signal
(SIGINT, SIGTERM, SIGHUP, SIGQUIT, as torchrun's) stops the job: while elasticrun follows it, at
once; while it submits it, as soon as the submit returns. Every further signal changes nothing:
``timeout`` signals elasticrun and its process group at once, an impatient user presses Ctrl-C
again, and the stop is already on its way (the daemon's kill: SIGTERM, the job's grace, SIGKILL).
It is told, never raised, so no traceback cuts the stop short. After the job ended there is
nothing to stop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Phase(Enum):
    """Where ``elasticrun`` is with its job.

    SUBMITTING -> FOLLOWING (the submit returned) -> STOPPING (a signal) | ENDED (the job ended);
    SUBMITTING -> STOPPING when a signal came during the submit.
    """

    SUBMITTING = "submitting"
    FOLLOWING = "following"
    STOPPING = "stopping"
    ENDED = "ended"


class Act(Enum):
    """What the handler does with a signal."""

    INTERRUPT = "interrupt"  # raise in the following: stop the job now
    DEFER = "defer"  # remember it: the job is stopped once the submit returns
    TELL = "tell"  # say that the stop is already on its way, and go on
    IGNORE = "ignore"  # the job ended: nothing to stop


@dataclass(frozen=True)
class Stops:
    phase: Phase = Phase.SUBMITTING
    why: str = ""  # the signal that asked for the stop ("": none yet)
    job: str = ""


def react(now: Stops, sig: str) -> tuple[Stops, Act]:
    """Where elasticrun is after signal ``sig`` (``"SIGTERM"``), and what to do about it."""
    match now.phase:
        case Phase.SUBMITTING if not now.why:
            return replace(now, why=sig), Act.DEFER
        case Phase.FOLLOWING:
            return replace(now, phase=Phase.STOPPING, why=sig), Act.INTERRUPT
        case Phase.ENDED:
            return now, Act.IGNORE
        case _:
            return now, Act.TELL


def following(now: Stops, job: str) -> Stops:
    """The submit returned ``job``: a signal from now on interrupts the following, unless one
    came during the submit (then the job is stopped at once)."""
    if now.phase is not Phase.SUBMITTING:
        return now
    return replace(now, phase=Phase.STOPPING if now.why else Phase.FOLLOWING, job=job)


def ended(now: Stops) -> Stops:
    """The following returned: the job ended by itself."""
    return replace(now, phase=Phase.ENDED) if now.phase is Phase.FOLLOWING else now


def name_of(sig: str) -> str:
    return "Ctrl-C" if sig == "SIGINT" else sig


def told(now: Stops, sig: str) -> str:
    """The line a further signal gets (``Act.TELL``)."""
    if now.phase is Phase.SUBMITTING:
        return f"elasticrun: {name_of(sig)} again: the job is stopped as soon as it is submitted\n"
    return f"elasticrun: {name_of(sig)} again: already stopping job {now.job}\n"
