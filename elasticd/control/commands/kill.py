from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.wire import KillArgs

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


async def kill(daemon: Daemon, args: KillArgs, caller: Caller) -> dict[str, Any]:
    """Kill a job: every process of it, grandchildren included; returns when they are gone."""
    return {"job": await daemon.manager.kill(args.job, caller.user)}


COMMAND = Command("kill", KillArgs, kill, Access.OWNER)
