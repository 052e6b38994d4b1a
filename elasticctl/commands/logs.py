"""``elasticctl logs JOB``: a job's output on this node, per rank and attempt.

Workers write straight to their log files, so lines carry no time of their own. Hence ``--since``
picks *attempts* by the time they started (when this node created their logs), and ``-t`` prefixes
each line with the time elasticctl read it: while following (``-f``), within a poll (0.2 s) of its
being written; lines that were already written when the command started show ``--:--:--.---``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time

from elasticctl.client import Client
from elasticctl.commands.base import Command, count
from elasticd.wire import LogsArgs, default

# ``--since``: matched with re's cache, so a command line without it compiles neither.
_DURATION = r"(\d+(?:\.\d+)?)([smhd])"
_CLOCK = r"\d\d?:\d\d(:\d\d)?"
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``10m``, ``2h``, ``1d``), a local time today
    (``14:30``, ``14:30:05``) or a local date and time (``2025-05-01T14:30``); seconds since the epoch."""
    import datetime  # only here: other command lines do without it (~1 ms)

    now = time.time() if now is None else now
    if m := re.fullmatch(_DURATION, text.strip()):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    if re.fullmatch(_CLOCK, text.strip()):
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


def arguments(lg: argparse.ArgumentParser) -> None:
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


def run(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl.follow import FollowOptions, exit_status, follow, follow_to_end

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


COMMAND = Command("logs", "print a job's output (the ranks that ran on this node)", arguments, run)
