from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import EventsArgs


async def events(service: CommandService, args: EventsArgs, caller: Caller) -> dict[str, Any]:
    """The cluster's event history (a job's, or all you may read); poll with the cursor to follow."""
    page = await service.events(args, caller)
    return {
        "events": [
            {
                "seq": s.seq,
                "happened_at": s.event.time,
                "kind": s.event.kind,
                "job": s.event.job,
                "node": s.event.node,
                "message": s.event.message,
                "fields": s.event.fields,
            }
            for s in page.events
        ],
        "cursor": page.cursor,
        "skipped": [{"key": k.key, "why": k.why} for k in page.skipped],
    }


COMMAND = Command("events", EventsArgs, events, Access.HISTORY)
