"""``elasticctl logs JOB``: a job's output on this node, per rank and attempt.

Workers write straight to their log files, so lines carry no time of their own. Hence ``--since``
picks *attempts* by the time they started (when this node created their logs), and ``-t`` prefixes
each line with the time elasticctl read it: while following (``-f``), within a poll (0.2 s) of its
being written; lines that were already written when the command started show ``--:--:--.---``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import re
import time
from collections.abc import Callable

from elasticctl.client import Client
from elasticctl.exits import EXIT_INTERRUPTED, EXIT_JOB_FAILED
from elasticctl.follow import FollowOptions, follow, follow_to_end
from elasticd.wire import JobState, JobView, LogsArgs, default

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_CLOCK = re.compile(r"^\d\d?:\d\d(:\d\d)?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def count(what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= 0."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"{what} is an integer >= 0, not {text!r}")
        return value

    return parse


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``10m``, ``2h``, ``1d``), a local time today
    (``14:30``, ``14:30:05``) or a local date and time (``2025-05-01T14:30``); seconds since the epoch."""
    now = time.time() if now is None else now
    if m := _DURATION.match(text.strip()):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    if _CLOCK.match(text.strip()):
        with contextlib.suppress(ValueError):
            today = datetime.datetime.fromtimestamp(now).date()
            return datetime.datetime.combine(today, datetime.time.fromisoformat(text.strip())).timestamp()
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()  # naive: local time
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"takes a duration (90s, 10m, 2h, 1d), a time (14:30) or a date and time "
            f"(2025-05-01T14:30), not {text!r}"
        ) from None


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    lg = add("logs", help="print a job's output (the ranks that ran on this node)")
    lg.add_argument("job")
    option = lg.add_argument
    option("--rank", type=count("a rank"), default=default(LogsArgs, "rank"), help="only this global rank")
    option("--attempt", type=count("an attempt"), default=default(LogsArgs, "attempt"),
           help="only this attempt (default: every one)")  # fmt: skip
    option("--tail", type=count("--tail"), default=default(LogsArgs, "tail"), metavar="N",
           help="start at each rank's last N lines")  # fmt: skip
    option("--since", type=parse_since, default=default(LogsArgs, "since"), metavar="WHEN",
           help="only attempts that started since WHEN: 10m, 2h, 14:30, 2025-05-01T14:30")  # fmt: skip
    option("-t", "--timestamps", action="store_true",
           help="prefix each line with the local time it was read (--:--:-- when unknown)")  # fmt: skip
    option("-f", "--follow", action="store_true",
           help="keep printing until the job ends; exit with its result")  # fmt: skip
    lg.set_defaults(func=cmd_logs)


def cmd_logs(client: Client, ns: argparse.Namespace) -> int:
    opts = FollowOptions(
        rank=ns.rank,
        attempt=ns.attempt,
        since=ns.since,
        tail=ns.tail,
        timestamps=ns.timestamps,
        until_end=ns.follow,
    )
    if not ns.follow:
        follow(client, ns.job, opts)
        return 0
    return exit_status(follow_to_end(client, ns.job, opts))


def exit_status(final: JobView | None) -> int:
    """How a command that followed a job to its end exits: 0 when it SUCCEEDED."""
    if final is None:
        return EXIT_INTERRUPTED
    return 0 if final["state"] == JobState.SUCCEEDED else EXIT_JOB_FAILED
