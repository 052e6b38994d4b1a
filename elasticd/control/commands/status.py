from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.wire import StatusArgs

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


async def status(daemon: Daemon, args: StatusArgs, caller: Caller) -> dict[str, Any]:
    """Show one job, or every job the cluster knows."""
    if args.job:
        return {"job": await daemon.manager.view(args.job)}
    return {"jobs": await daemon.manager.views()}


COMMAND = Command("status", StatusArgs, status, Access.CONNECTED)
