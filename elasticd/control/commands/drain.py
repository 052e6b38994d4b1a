from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.errors import InvalidArgs
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import DrainArgs, UndrainArgs


async def drain(service: CommandService, args: DrainArgs, caller: Caller) -> dict[str, Any]:
    """Make a node leave its jobs (or one job) gracefully and take no new ones."""
    if args.grace_s is not None and not 0 <= args.grace_s <= 3600:
        raise InvalidArgs("grace_s must be 0..3600 seconds")
    return await service.nodes.drain(args.node, args.job, args.grace_s, args.force, caller.user)


async def undrain(service: CommandService, args: UndrainArgs, caller: Caller) -> dict[str, Any]:
    """Let a drained node take jobs again (it joins running elastic jobs at their next round), or
    return one of its GPUs (``gpu``) that it took out of the pool as unhealthy."""
    if args.gpu is not None:
        if args.job is not None:
            raise InvalidArgs("undrain takes --job or --gpu, not both")
        return await service.nodes.return_gpu(args.node, args.gpu, caller.user)
    return await service.nodes.undrain(args.node, args.job)


DRAIN = Command("drain", DrainArgs, drain, Access.OWNER)
UNDRAIN = Command("undrain", UndrainArgs, undrain, Access.OWNER)
