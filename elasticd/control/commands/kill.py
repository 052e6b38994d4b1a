from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import KillArgs


async def kill(service: CommandService, args: KillArgs, caller: Caller) -> dict[str, Any]:
    """Kill a job: every process of it, grandchildren included; returns when they are gone."""
    return {"job": await service.jobs.kill(args.job, caller.user)}


COMMAND = Command("kill", KillArgs, kill, Access.OWNER)
