from __future__ import annotations

import argparse

from elasticctl.client import Client
from elasticctl.commands.base import Command, print_json
from elasticd.wire import NoArgs, NodesReply


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl.render import etcd_line, gpus_table, nodes_table

    reply: NodesReply = client.request("nodes", NoArgs())
    if ns.json:
        print_json(reply)
    else:
        print(nodes_table(reply["nodes"]))
        if (gpus := gpus_table(reply["nodes"])) is not None:
            print()
            print(gpus)
        if (etcd := reply.get("etcd")) is not None:
            print(etcd_line(etcd))
    return 0


COMMAND = Command("nodes", "list the cluster's live nodes", arguments, run)
