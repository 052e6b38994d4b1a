"""``elasticctl``'s commands, one module each, in an explicit registry (no registration by
import); ``elasticctl.parser`` builds the command line from it, in this order."""

from __future__ import annotations

from elasticctl.commands import check, completion, drain, events, kill, logs, nodes, ping, rm, status, submit
from elasticctl.commands.base import Command, LocalCommand

REGISTRY: dict[str, Command | LocalCommand] = {
    c.name: c
    for c in (
        submit.COMMAND,
        status.COMMAND,
        kill.COMMAND,
        rm.COMMAND,
        logs.COMMAND,
        events.COMMAND,
        nodes.COMMAND,
        drain.DRAIN,
        drain.UNDRAIN,
        check.COMMAND,
        ping.COMMAND,
        completion.COMMAND,
    )
}
