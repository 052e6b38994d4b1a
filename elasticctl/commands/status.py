"""``elasticctl status``: one job or a table of them, filtered, as JSON or ids, once or ``--watch``
(``elasticctl.views.status`` does it, imported when it runs)."""

from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command
from elasticd.wire import JobState, StatusArgs, default

WATCH_DEFAULT_S = 2.0  # ``status --watch`` with no SECONDS


def _states(text: str) -> list[JobState]:
    """``--state RUNNING,pending``: job states, in any case."""
    out = []
    for word in text.split(","):
        try:
            out.append(JobState(word.strip().upper()))
        except ValueError:
            choices = ", ".join(s.value for s in JobState)
            raise argparse.ArgumentTypeError(f"{word.strip()!r} is not a job state ({choices})") from None
    return out


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"takes seconds between 0.1 and 86400, not {text!r}")
    return value


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", nargs="?", default=default(StatusArgs, "job"), metavar="JOB", help="one job")
    p.add_argument(
        "--state",
        dest="states",
        type=_states,
        default=default(StatusArgs, "states"),
        metavar="STATE[,STATE]",
        help="only jobs in these states (e.g. RUNNING,PENDING)",
    )
    p.add_argument("--user", default=default(StatusArgs, "user"), help="only this user's jobs")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="as JSON, times in ISO 8601 (UTC)")
    out.add_argument("-q", "--quiet", action="store_true", help="only job ids, one per line")
    p.add_argument(
        "--watch",
        nargs="?",
        type=_seconds,
        const=WATCH_DEFAULT_S,
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_DEFAULT_S:g}) until Ctrl-C (a JOB goes before it)",
    )


def run(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl.views import status

    return status.run(client, ns)


COMMAND = Command("status", "show one job, or all jobs (filters, JSON, ids, --watch)", arguments, run)
