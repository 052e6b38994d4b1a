from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command
from elasticd.wire import JobReply, KillArgs


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job")


def run(client: Client, ns: argparse.Namespace) -> int:
    reply: JobReply = client.request("kill", KillArgs(ns.job), timeout_s=max(60.0, client.timeout_s))
    job = reply["job"]
    print(f"{job['id']} {job['state']}")
    return 0


COMMAND = Command("kill", "kill a job and every process it started", arguments, run)
