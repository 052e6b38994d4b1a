from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import LogsArgs


async def logs(service: CommandService, args: LogsArgs, caller: Caller) -> dict[str, Any]:
    """Read a job's output from a cursor; poll with the returned cursor to follow."""
    view, chunks, cursor = await service.logs(args.job, args.cursor, args.rank)
    return {
        "chunks": [{"attempt": c.attempt, "rank": c.rank, "text": c.text} for c in chunks],
        "cursor": cursor,
        "state": view.get("state"),
        "node": view.get("node"),
    }


COMMAND = Command("logs", LogsArgs, logs, Access.OWNER)
