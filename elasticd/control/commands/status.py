from __future__ import annotations

from typing import Any

from elasticd.control.commands.base import Command
from elasticd.errors import InvalidArgs
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import StatusArgs
from elasticd.wire.replies import Encoded


async def status(service: CommandService, args: StatusArgs, caller: Caller) -> dict[str, Any] | Encoded:
    """Show one job, or every job the cluster knows (those in ``states``, ``user``'s, when given)."""
    if args.job:
        if args.states or args.user is not None or args.rows:
            raise InvalidArgs("states, user and rows are for the list of all jobs: they do not go with a job")
        return {"job": await service.jobs.view(args.job)}
    listed = await service.jobs.views_json(args.states, args.user, args.rows)
    return Encoded(b'{"rows": ' if args.rows else b'{"jobs": ', listed, b"}")


COMMAND = Command("status", StatusArgs, status, Access.CONNECTED)
