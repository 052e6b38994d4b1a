from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import RmArgs


async def rm(service: CommandService, args: RmArgs, caller: Caller) -> dict[str, Any]:
    """Remove a job that has ended: its records in etcd and this node's logs of it."""
    return await service.jobs.rm(args.job)


COMMAND = Command("rm", RmArgs, rm, Access.OWNER)
