from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command, print_json
from elasticd.wire import NoArgs, PingReply


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(client: Client, ns: argparse.Namespace) -> int:
    result: PingReply = client.request("ping", NoArgs(), timeout_s=ns.timeout)
    print_json(result) if ns.json else print(f"elasticd {result['version']} on node {result['node']}: ok")
    return 0


COMMAND = Command("ping", "check that the daemon answers", arguments, run)
