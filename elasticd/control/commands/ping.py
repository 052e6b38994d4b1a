from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from elasticd import __version__
from elasticd.control.access import Access, Caller
from elasticd.control.commands.base import Command
from elasticd.wire import NoArgs

if TYPE_CHECKING:
    from elasticd.daemon.app import Daemon


async def ping(daemon: Daemon, args: NoArgs, caller: Caller) -> dict[str, Any]:
    """Check that the daemon answers; report its node, version and etcd."""
    return {
        "node": daemon.node_id,
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - daemon.started_at, 3),
        "etcd": daemon.etcd_endpoints,
        "embedded_etcd": daemon.settings.embedded_etcd,
        "you": {"uid": caller.uid, "gid": caller.gid, "user": caller.user},
    }


COMMAND = Command("ping", NoArgs, ping, Access.CONNECTED)
