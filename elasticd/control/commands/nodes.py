from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.wire import NoArgs

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


async def nodes(daemon: Daemon, args: NoArgs, caller: Caller) -> dict[str, Any]:
    """List the live nodes of the cluster with their devices and free capacity."""
    records = await asyncio.to_thread(daemon.registry.records)  # bad records are skipped (and logged)
    return {"nodes": [r.to_json() for r in records]}


COMMAND = Command("nodes", NoArgs, nodes, Access.CONNECTED)
