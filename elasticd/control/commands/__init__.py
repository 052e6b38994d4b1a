"""The control commands, one module each, in an explicit registry (no registration by import)."""

from __future__ import annotations

from typing import Any

from elasticd.control.commands import check, drain, events, kill, logs, nodes, ping, rm, status, submit
from elasticd.control.commands.base import Command

REGISTRY: dict[str, Command[Any]] = {
    c.name: c
    for c in (
        ping.COMMAND,
        submit.COMMAND,
        status.COMMAND,
        kill.COMMAND,
        logs.COMMAND,
        nodes.COMMAND,
        drain.DRAIN,
        drain.UNDRAIN,
        rm.COMMAND,
        events.COMMAND,
        check.COMMAND,
    )
}
