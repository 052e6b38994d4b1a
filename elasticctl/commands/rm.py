from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command
from elasticd.wire import RmArgs, RmReply


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job")


def run(client: Client, ns: argparse.Namespace) -> int:
    reply: RmReply = client.request("rm", RmArgs(ns.job))
    print(f"{reply['job']} removed")
    return 0


COMMAND = Command(
    "rm", "remove an ended job: its records, and its logs (kept for job_retention otherwise)", arguments, run
)
