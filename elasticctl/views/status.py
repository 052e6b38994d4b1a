"""``elasticctl status``: one job or a table of them, filtered, as JSON or ids, once or ``--watch``.

``refresh`` is one look: a request and its rendering, as text (unit-tested against a canned
client); ``run`` prints it once, or redraws it every few seconds until Ctrl-C (exit 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from elasticctl import render
from elasticctl.entry import UsageError
from elasticd.wire import StatusArgs, StatusReply

CLEAR = "\033[H\033[2J"  # cursor home, clear the screen


class Requester(Protocol):
    def request(self, cmd: str, args: object, timeout_s: float | None = None) -> Any: ...


def status_args(ns: argparse.Namespace) -> StatusArgs:
    if ns.job is not None and (ns.states or ns.user is not None):
        raise UsageError("--state and --user filter the list of jobs: give no JOB with them")
    # The table and the ids need a job's row, not its whole view (``JobRow``: what a long queue
    # costs to send and decode); ``--json`` prints whole views.
    return StatusArgs(ns.job, list(ns.states), ns.user, rows=ns.job is None and not ns.json)


def render_reply(reply: StatusReply, ns: argparse.Namespace, now: float) -> str:
    """The text for one reply: JSON (times in ISO 8601), ids, a job's detail, or the jobs' table."""
    if ns.job is not None:
        if ns.json:
            return json.dumps(render.iso_times(reply["job"]), indent=2, sort_keys=True)
        return reply["job"]["id"] if ns.quiet else render.job_detail(reply["job"], now)
    if ns.json:
        return json.dumps(render.iso_times(reply["jobs"]), indent=2, sort_keys=True)
    rows = reply["rows"]
    return "\n".join(j["id"] for j in rows) if ns.quiet else render.jobs_table(rows, now)


def refresh(client: Requester, ns: argparse.Namespace, now: Callable[[], float] = time.time) -> str:
    """One look at the job(s): what ``status`` prints, or what ``--watch`` draws each time."""
    reply: StatusReply = client.request("status", status_args(ns))
    return render_reply(reply, ns, now())


def run(client: Requester, ns: argparse.Namespace) -> int:
    if ns.watch is None:
        text = refresh(client, ns)
        if text:
            print(text)
        return 0
    tty = sys.stdout.isatty()
    try:
        while True:
            text = refresh(client, ns)
            if tty:  # redraw in place, as watch(1)
                print(f"{CLEAR}every {ns.watch:g}s, {render.long_time(time.time())} (Ctrl-C to stop)\n")
            if text:
                print(text)
            if not tty:
                print()  # an empty line between one look and the next
            sys.stdout.flush()
            time.sleep(ns.watch)
    except KeyboardInterrupt:
        return 0
