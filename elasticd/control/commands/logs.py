from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.jobs.logs import read_new

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


@dataclass(frozen=True)
class LogsArgs:
    job: str
    rank: int | None = None
    cursor: dict[str, int] = field(default_factory=dict)


async def logs(daemon: Daemon, args: LogsArgs, caller: Caller) -> dict[str, Any]:
    """Read a job's output from a cursor; poll with the returned cursor to follow."""
    view = await daemon.manager.view(args.job)
    ended = view.get("state") in ("SUCCEEDED", "FAILED", "KILLED")
    chunks, cursor = await asyncio.to_thread(
        read_new, daemon.log_dir, args.job, args.cursor, args.rank, whole=ended
    )
    return {
        "chunks": [{"attempt": c.attempt, "rank": c.rank, "text": c.text} for c in chunks],
        "cursor": cursor,
        "state": view.get("state"),
        "node": view.get("node"),
    }


COMMAND = Command("logs", LogsArgs, logs, Access.OWNER)
