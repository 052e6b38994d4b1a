"""``elasticctl``: submit, status, kill, logs, events, nodes, drain, undrain, ping.

Exit codes (``elasticctl.exits``): 0 success; 1 the daemon cannot be reached; 2 usage error; 3 the
daemon reported an error; 4 a followed job ended FAILED or KILLED.

The command line is ``elasticctl.parser``; ``COMMANDS`` runs each command. What runs after a
request was sent (following a job) and the commands with a module of their own are imported when
they run: ``elasticctl submit`` starts every job, and its imports come before its request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from elasticctl import torchrun
from elasticctl.client import Client, ExitCodes, guarded, local_gpus
from elasticctl.entry import UsageError, resolve_entry
from elasticctl.exits import EXIT_DAEMON_ERROR, EXIT_UNREACHABLE, EXIT_USAGE
from elasticctl.exits import EXIT_JOB_FAILED as EXIT_JOB_FAILED  # tests and scripts read it here
from elasticctl.parser import build_parser
from elasticd.control.address import default_socket_path
from elasticd.wire import (
    DrainArgs,
    DrainReply,
    JobReply,
    JobState,
    JobView,
    KillArgs,
    NoArgs,
    NodesReply,
    PingReply,
    RmArgs,
    RmReply,
    SubmitArgs,
    UndrainArgs,
    WaitsFor,
)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def submit_args(ns: argparse.Namespace, gpus: Callable[[], int] = lambda: 0) -> SubmitArgs:
    """The submit command's arguments (sbatch-like defaults); see ``submit_request``."""
    return submit_request(ns, gpus)[0]


def submit_request(ns: argparse.Namespace, gpus: Callable[[], int]) -> tuple[SubmitArgs, torchrun.Mapped]:
    """Turn the CLI's view of a job into the submit command's arguments, with what torchrun's
    flags among them came to (``gpus``: this node's GPUs, for ``--nproc-per-node gpu|auto``)."""
    mapped = torchrun.interpret(ns, gpus)
    fields = mapped.fields
    cwd = os.path.abspath(ns.cwd or os.getcwd())
    env = {} if ns.env_clear else dict(os.environ)
    env |= _env_pairs(ns.env)
    kind, entry, python = resolve_entry(ns.target, ns.module, ns.no_python, cwd, env, ns.python)
    memory_limit = None
    if ns.memory_limit is not None:
        from elasticd.workers.cgroups.limits import parse_size  # the daemon's module: only for this option

        try:
            memory_limit = parse_size(ns.memory_limit)
        except ValueError as exc:
            raise UsageError(f"--memory-limit: {exc}") from exc
    args = SubmitArgs(
        entry_kind=kind.value,
        entry=entry,
        cwd=cwd,
        args=list(ns.script_args),  # argparse has already dropped the separating "--"
        python=python,
        env=env,
        nnodes=ns.nnodes,
        nproc_per_node=fields["nproc_per_node"],
        max_restarts=ns.max_restarts,
        name=ns.name,
        stop_grace_s=ns.stop_grace if ns.stop_grace is not None else fields.get("stop_grace_s"),
        nodes=[n.strip() for n in (ns.nodes or "").split(",") if n.strip()],
        last_call_s=fields.get("last_call_s", ns.last_call),
        join_timeout_s=fields.get("join_timeout_s", ns.join_timeout),
        memory_limit_bytes=memory_limit,
        cpu_limit=ns.cpu_limit,
        nofile=ns.nofile,
        hang_timeout=ns.hang_timeout,
        max_same_failures=ns.max_same_failures,
        warm=ns.warm,
        preload=ns.preload,
        job_id=fields.get("job_id"),
        priority=ns.priority,
    )
    return args, mapped


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def cmd_submit(client: Client, ns: argparse.Namespace) -> int:
    args, mapped = submit_request(ns, lambda: local_gpus(client))
    for note in mapped.notes:
        print(f"elasticctl: {note}", file=sys.stderr)
    job: JobView = client.request("submit", args)
    print(job["id"], flush=True)
    if not ns.follow:
        if job["state"] == JobState.PENDING and job.get("waits_for") == WaitsFor.CAPACITY:
            print(f"elasticctl: {job['id']} is PENDING: {job['reason']}", file=sys.stderr)
        return 0
    from elasticctl.follow import FollowOptions, follow_to_end  # after the request: not on its path
    from elasticctl.logs_cmd import exit_status

    ranks, nproc = mapped.local_ranks, args.nproc_per_node
    show = (lambda rank: rank % nproc in ranks) if ranks is not None else None
    return exit_status(follow_to_end(client, job["id"], FollowOptions(show=show, life=True)))


def cmd_rm(client: Client, ns: argparse.Namespace) -> int:
    reply: RmReply = client.request("rm", RmArgs(ns.job))
    print(f"{reply['job']} removed")
    return 0


def cmd_kill(client: Client, ns: argparse.Namespace) -> int:
    reply: JobReply = client.request("kill", KillArgs(ns.job), timeout_s=max(60.0, client.timeout_s))
    job = reply["job"]
    print(f"{job['id']} {job['state']}")
    return 0


def cmd_nodes(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl.render import etcd_line, nodes_table

    reply: NodesReply = client.request("nodes", NoArgs())
    if ns.json:
        _print_json(reply)
    else:
        print(nodes_table(reply["nodes"]))
        if (etcd := reply.get("etcd")) is not None:
            print(etcd_line(etcd))
    return 0


def cmd_drain(client: Client, ns: argparse.Namespace) -> int:
    result: DrainReply = client.request("drain", DrainArgs(ns.node, ns.job, ns.grace, ns.force))
    scope = f"job {ns.job}" if ns.job else "all its jobs"
    print(f"draining {result['node']} from {scope}: {', '.join(result['jobs']) or 'no running job affected'}")
    return 0


def cmd_undrain(client: Client, ns: argparse.Namespace) -> int:
    client.request("undrain", UndrainArgs(ns.node, ns.job))
    print(f"{ns.node} takes jobs again")
    return 0


def cmd_ping(client: Client, ns: argparse.Namespace) -> int:
    result: PingReply = client.request("ping", NoArgs(), timeout_s=ns.timeout)
    _print_json(result) if ns.json else print(f"elasticd {result['version']} on node {result['node']}: ok")
    return 0


# The commands with a module of their own: each is imported when it runs, never to parse.
def cmd_status(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl import status_cmd

    return status_cmd.cmd_status(client, ns)


def cmd_logs(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl import logs_cmd

    return logs_cmd.cmd_logs(client, ns)


def cmd_events(client: Client, ns: argparse.Namespace) -> int:
    from elasticctl import events_cmd

    return events_cmd.cmd_events(client, ns)


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "submit": cmd_submit,
    "status": cmd_status,
    "kill": cmd_kill,
    "rm": cmd_rm,
    "logs": cmd_logs,
    "events": cmd_events,
    "nodes": cmd_nodes,
    "drain": cmd_drain,
    "undrain": cmd_undrain,
    "ping": cmd_ping,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "completion":  # needs no daemon
        from elasticctl import completion

        print(completion.script(parser, ns.shell), end="")
        return 0
    command = COMMANDS[ns.command]
    client = Client(ns.socket or default_socket_path(), timeout_s=ns.timeout)
    codes = ExitCodes(EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DAEMON_ERROR)
    return guarded("elasticctl", client, lambda: int(command(client, ns)), codes)
