from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command
from elasticd.wire import DrainArgs, DrainReply, UndrainArgs, default


def drain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--job", default=default(DrainArgs, "job"), help="leave only this job")
    p.add_argument(
        "--grace",
        type=float,
        default=default(DrainArgs, "grace_s"),
        help="seconds between SIGTERM and SIGKILL for its workers",
    )
    p.add_argument(
        "--force",
        action="store_true",
        default=default(DrainArgs, "force"),
        help="drain even if a job falls below its minimum",
    )


def drain(client: Client, ns: argparse.Namespace) -> int:
    result: DrainReply = client.request("drain", DrainArgs(ns.node, ns.job, ns.grace, ns.force))
    scope = f"job {ns.job}" if ns.job else "all its jobs"
    print(f"draining {result['node']} from {scope}: {', '.join(result['jobs']) or 'no running job affected'}")
    return 0


def undrain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--job", default=default(UndrainArgs, "job"), help="only for this job")
    p.add_argument(
        "--gpu",
        default=default(UndrainArgs, "gpu"),
        metavar="UUID",
        help="return this unhealthy GPU to the pool",
    )


def undrain(client: Client, ns: argparse.Namespace) -> int:
    client.request("undrain", UndrainArgs(ns.node, ns.job, ns.gpu))
    print(f"GPU {ns.gpu} of {ns.node} is back in the pool" if ns.gpu else f"{ns.node} takes jobs again")
    return 0


DRAIN = Command("drain", "make a node leave its jobs gracefully and take no new ones", drain_arguments, drain)
UNDRAIN = Command("undrain", "let a drained node take jobs again", undrain_arguments, undrain)
