from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import NoArgs


async def nodes(service: CommandService, args: NoArgs, caller: Caller) -> dict[str, Any]:
    """List the live nodes of the cluster with their devices and free capacity, and how full etcd is."""
    reply: dict[str, Any] = {"nodes": [r.to_json() for r in await service.nodes.records()]}
    if (space := service.nodes.etcd_space()) is not None:
        reply["etcd"] = space.to_json()
    return reply


COMMAND = Command("nodes", NoArgs, nodes, Access.CONNECTED)
