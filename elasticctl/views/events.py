"""``elasticctl events [-f] [JOB] [--json]``: the cluster's event history, oldest first.

Text: one line per event, in local time. ``--json``: JSON lines, one event each, with ``time`` in
ISO 8601 (UTC), ``kind``, ``job``, ``node``, ``message``, ``seq`` and the event's ``fields``.
``-f`` keeps polling with the reply's cursor and prints each new event once, until Ctrl-C.
Events that did not decode are named on stderr, once each, and never shown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from elasticctl import render
from elasticctl.exits import EXIT_INTERRUPTED
from elasticd.wire import EventsArgs, EventsReply, EventView

POLL_S = 1.0


class Requester(Protocol):
    def request(self, cmd: str, args: object, timeout_s: float | None = None) -> Any: ...


def as_json(event: EventView) -> str:
    out = {
        "time": render.iso(event["happened_at"]),
        "kind": event["kind"],
        "job": event["job"],
        "node": event["node"],
        "message": event["message"],
        "seq": event["seq"],
        "fields": event["fields"],
    }
    return json.dumps(out, sort_keys=False)


def as_text(event: EventView) -> str:
    at = datetime.fromtimestamp(event["happened_at"]).strftime("%Y-%m-%d %H:%M:%S")
    return f"{at}  {event['kind']:<13} {event['job'] or '-'}  {event['node'] or '-'}  {event['message']}"


def show(reply: EventsReply, as_json_lines: bool, seen_bad: set[str]) -> None:
    for bad in reply["skipped"]:
        if bad["key"] not in seen_bad:
            seen_bad.add(bad["key"])
            print(f"elasticctl: skipped event {bad['key']}: {bad['why']}", file=sys.stderr)
    for event in reply["events"]:
        print(as_json(event) if as_json_lines else as_text(event))
    sys.stdout.flush()


def run(client: Requester, ns: argparse.Namespace, sleep: Callable[[float], None] = time.sleep) -> int:
    cursor = 0
    seen_bad: set[str] = set()
    try:
        while True:
            reply: EventsReply = client.request("events", EventsArgs(ns.job, after=cursor))
            show(reply, ns.json, seen_bad)
            cursor = max(cursor, reply["cursor"])
            if not ns.follow:
                return 0
            sleep(POLL_S)
    except KeyboardInterrupt:
        return 0 if ns.follow else EXIT_INTERRUPTED
