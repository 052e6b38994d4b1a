from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import StatusArgs


async def status(service: CommandService, args: StatusArgs, caller: Caller) -> dict[str, Any]:
    """Show one job, or every job the cluster knows."""
    if args.job:
        return {"job": await service.view(args.job)}
    return {"jobs": await service.views()}


COMMAND = Command("status", StatusArgs, status, Access.CONNECTED)
