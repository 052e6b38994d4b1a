from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import LogsArgs


async def logs(service: CommandService, args: LogsArgs, caller: Caller) -> dict[str, Any]:
    """Read a job's output from a cursor; poll with the returned cursor to follow."""
    got = await service.jobs.logs(args)
    return {
        "chunks": [{"attempt": c.attempt, "rank": c.rank, "text": c.text} for c in got.read.chunks],
        "cursor": got.read.cursor,
        "state": got.view.get("state"),
        "node": service.facts.node_id,
        "more": got.read.more,
        "job": got.view,
        "round_info": got.round,
        "attempt_started_at": {str(a): t for a, t in sorted(got.starts.items())},
        "finishing_here": got.finishing,
    }


COMMAND = Command("logs", LogsArgs, logs, Access.OWNER)
