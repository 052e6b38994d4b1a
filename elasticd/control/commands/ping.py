from __future__ import annotations

import os
import time
from typing import Any

from elasticd import __version__
from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService
from elasticd.wire import NoArgs


async def ping(service: CommandService, args: NoArgs, caller: Caller) -> dict[str, Any]:
    """Check that the daemon answers; report its node, version and etcd."""
    return {
        "node": service.facts.node_id,
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - service.facts.started_at, 3),
        "etcd": list(service.facts.etcd_endpoints),
        "embedded_etcd": service.facts.embedded_etcd,
        "you": {"uid": caller.uid, "gid": caller.gid, "user": caller.user},
    }


COMMAND = Command("ping", NoArgs, ping, Access.CONNECTED)
