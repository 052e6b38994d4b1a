from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.jobs.logs import read_new
from elasticd.wire import LogsArgs, is_terminal

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


async def logs(daemon: Daemon, args: LogsArgs, caller: Caller) -> dict[str, Any]:
    """Read a job's output from a cursor; poll with the returned cursor to follow."""
    view = await daemon.manager.view(args.job)
    ended = is_terminal(view.get("state"))
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
