from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.errors import InvalidArgs
from elasticd.wire import DrainArgs, UndrainArgs

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


async def drain(daemon: Daemon, args: DrainArgs, caller: Caller) -> dict[str, Any]:
    """Make a node leave its jobs (or one job) gracefully and take no new ones."""
    if args.grace_s is not None and not 0 <= args.grace_s <= 3600:
        raise InvalidArgs("grace_s must be 0..3600 seconds")
    return await daemon.manager.drain(args.node, args.job, args.grace_s, args.force, caller.user)


async def undrain(daemon: Daemon, args: UndrainArgs, caller: Caller) -> dict[str, Any]:
    """Let a drained node take jobs again (it joins running elastic jobs at their next round)."""
    return await daemon.manager.undrain(args.node, args.job)


DRAIN = Command("drain", DrainArgs, drain, Access.OWNER)
UNDRAIN = Command("undrain", UndrainArgs, undrain, Access.OWNER)
