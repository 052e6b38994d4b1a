"""Following a job: stream its ranks' output and return when it ends."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from elasticctl.client import Client
from elasticd.jobs.logs import rank_prefixed
from elasticd.wire import LogsArgs, LogsReply, is_terminal

POLL_S = 0.2


def follow(
    client: Client,
    job: str,
    rank: int | None,
    until_end: bool = True,
    show: Callable[[int], bool] | None = None,
) -> LogsReply:
    """Print new output with ``[rankK]:`` prefixes until the job ends; returns its last logs reply.
    ``show`` picks the ranks whose output is printed (all by default)."""
    cursor: dict[str, int] = {}
    attempt_seen = -1
    while True:
        reply: LogsReply = client.request("logs", LogsArgs(job, rank, cursor))
        cursor = reply["cursor"]
        for chunk in reply["chunks"]:
            if chunk["attempt"] > attempt_seen:
                if attempt_seen >= 0 or chunk["attempt"] > 0:
                    print(
                        f"elasticctl: attempt {chunk['attempt']} (restart {chunk['attempt']})",
                        file=sys.stderr,
                    )
                attempt_seen = chunk["attempt"]
            if show is not None and not show(chunk["rank"]):
                continue
            sys.stdout.write(rank_prefixed(chunk["rank"], chunk["text"]))
        sys.stdout.flush()
        if is_terminal(reply["state"]) and not reply["chunks"]:
            return reply
        if not until_end and not reply["chunks"]:
            return reply
        if not reply["chunks"]:
            time.sleep(POLL_S)
