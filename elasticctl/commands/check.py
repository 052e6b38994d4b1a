from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command, print_json
from elasticctl.exits import EXIT_CHECK_FAILED
from elasticd.wire import CheckArgs, CheckReply


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("nodes", nargs="*", metavar="NODE", help="the nodes to check (default: every live node)")
    p.add_argument("--json", action="store_true")


def run(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl.render import check_table

    reply: CheckReply = client.request("check", CheckArgs(ns.nodes), timeout_s=60.0)
    if ns.json:
        print_json(reply)
    else:
        print(check_table(reply))
    return 0 if all(r["verdict"] == "ok" for r in reply["nodes"]) else EXIT_CHECK_FAILED


COMMAND = Command(
    "check",
    "check nodes (compute, and the link to each) against the cluster's figures (admins)",
    arguments,
    run,
)
