"""``elasticctl logs JOB``: a job's output on this node, per rank and attempt.

Workers write straight to their log files, so lines carry no time of their own. Hence ``--since``
picks *attempts* by the time they started (when this node created their logs), and ``-t`` prefixes
each line with the time elasticctl read it: while following (``-f``), within a poll (0.2 s) of its
being written; lines that were already written when the command started show ``--:--:--.---``.
"""

from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.exits import EXIT_INTERRUPTED, EXIT_JOB_FAILED
from elasticctl.follow import FollowOptions, follow, follow_to_end
from elasticd.wire import JobState, JobView


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
