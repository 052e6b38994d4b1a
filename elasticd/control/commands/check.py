from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.errors import InvalidArgs
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.terms.ids import valid_node_id
from elasticd.wire import CheckArgs

MAX_NODES_NAMED = 256


async def check(service: CommandService, args: CheckArgs, caller: Caller) -> dict[str, Any]:
    """Check nodes (every live node by default): compute, and this node's link to each; each
    against the cluster's figures."""
    if len(args.nodes) > MAX_NODES_NAMED or not all(valid_node_id(n) for n in args.nodes):
        raise InvalidArgs(f"nodes must be at most {MAX_NODES_NAMED} node ids")
    return await service.nodes.check(list(dict.fromkeys(args.nodes)), caller.user)


COMMAND = Command("check", CheckArgs, check, Access.ADMIN)
