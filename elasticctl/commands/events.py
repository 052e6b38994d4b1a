"""``elasticctl events [-f] [JOB] [--json]``: the cluster's event history, oldest first
(``elasticctl.views.events`` prints it, imported when it runs)."""

from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command
from elasticd.wire import EventsArgs, default


def arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument("job", nargs="?", default=default(EventsArgs, "job"), metavar="JOB", help="only this job")
    ev.add_argument("-f", "--follow", action="store_true", help="keep printing new events until Ctrl-C")
    ev.add_argument("--json", action="store_true", help="JSON lines, times in ISO 8601 (UTC)")


def run(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl.views import events

    return events.run(client, ns)


COMMAND = Command(
    "events", "the cluster's event history: submits, rounds, failures, drains, hangs", arguments, run
)
