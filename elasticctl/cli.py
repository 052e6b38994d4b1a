"""``elasticctl``: submit, status, kill, logs, events, nodes, drain, undrain, ping.

Exit codes (``elasticctl.exits``): 0 success; 1 the daemon cannot be reached; 2 usage error; 3 the
daemon reported an error; 4 a followed job ended FAILED or KILLED.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticctl import completion, events_cmd, logs_cmd, render, status_cmd, torchrun
from elasticctl.client import Client, ExitCodes, guarded
from elasticctl.entry import UsageError, resolve_entry
from elasticctl.exits import EXIT_DAEMON_ERROR, EXIT_UNREACHABLE, EXIT_USAGE
from elasticctl.exits import EXIT_JOB_FAILED as EXIT_JOB_FAILED  # tests and scripts read it here
from elasticctl.follow import FollowOptions, follow_to_end
from elasticctl.run import local_gpus
from elasticd import __version__
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
    default,
)
from elasticd.workers.limits import parse_size


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
    ranks, nproc = mapped.local_ranks, args.nproc_per_node
    show = (lambda rank: rank % nproc in ranks) if ranks is not None else None
    return logs_cmd.exit_status(follow_to_end(client, job["id"], FollowOptions(show=show, life=True)))


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
    reply: NodesReply = client.request("nodes", NoArgs())
    if ns.json:
        _print_json(reply["nodes"])
    else:
        print(render.nodes_table(reply["nodes"]))
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


def _connection_options(p: argparse.ArgumentParser, after_command: bool) -> None:
    """``--socket`` and ``--timeout`` go before or after the command (after wins)."""
    socket_default: object = argparse.SUPPRESS if after_command else None
    timeout_default: object = argparse.SUPPRESS if after_command else 15.0
    p.add_argument("--socket", type=Path, default=socket_default,
                   help="control socket (default: $ELASTICD_SOCKET or the system one)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=timeout_default,
                   help="seconds to wait for the daemon (default 15)")  # fmt: skip


def _nproc(text: str) -> int | str:
    """``--nproc-per-node``: a number, or gpu, cpu or auto (resolved at submit, as torchrun does)."""
    if text.isdigit():
        return int(text)
    if text in ("gpu", "cpu", "auto"):
        return text
    raise argparse.ArgumentTypeError(f"takes a number, gpu, cpu or auto, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticctl", description="Control the local elasticd.")
    p.add_argument("--version", action="version", version=f"elasticctl {__version__}")
    _connection_options(p, after_command=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, after_command=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = functools.partial(sub.add_parser, parents=[common])

    s = add("submit", help="submit a job (torchrun-style entry point)")
    job = functools.partial(default, SubmitArgs)  # every default comes from the wire schema
    s.add_argument("--nnodes", default=job("nnodes"), help="N or MIN:MAX nodes (default %(default)s)")
    s.add_argument("--nodes", help="comma-separated nodes allowed to take part (default: any; a "
                   "single-node job runs on the node it was submitted to)")  # fmt: skip
    s.add_argument(
        "--last-call",
        type=float,
        default=job("last_call_s"),
        help="seconds a round waits for more nodes once MIN joined (default %(default)g)",
    )
    s.add_argument(
        "--join-timeout",
        type=float,
        default=job("join_timeout_s"),
        help="seconds to wait for MIN nodes before failing (default %(default)g)",
    )
    s.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=_nproc,
        default=job("nproc_per_node"),
        help="workers per node: N, gpu, cpu or auto, as torchrun (default %(default)s)",
    )
    s.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=job("max_restarts"),
        help="job-wide restart budget (default %(default)s)",
    )
    s.add_argument("--name", default=job("name"), help="job name (default: the script's name)")
    s.add_argument("--env", action="append", default=[], metavar="K=V", help="set a variable (repeatable)")
    s.add_argument("--env-clear", action="store_true", help="start from an empty environment")
    s.add_argument("--cwd", help="working directory (default: the current one)")
    s.add_argument("--python", help="interpreter (default: `python` on your PATH, so your venv)")
    s.add_argument(
        "--stop-grace",
        type=float,
        default=job("stop_grace_s"),
        help="seconds between SIGTERM and SIGKILL for workers",
    )
    s.add_argument("--memory-limit", metavar="SIZE", help="memory per worker, e.g. 8G (its whole tree)")
    s.add_argument(
        "--cpu-limit",
        type=float,
        metavar="CPUS",
        default=job("cpu_limit"),
        help="CPUs per worker, e.g. 2 or 0.5",
    )
    s.add_argument(
        "--nofile",
        type=int,
        metavar="N",
        default=job("nofile"),
        help="open files per worker process (RLIMIT_NOFILE)",
    )
    torchrun.add_elasticd_flags(s)
    s.add_argument("--follow", "-f", action="store_true", help="stream output; exit with the job's result")
    s.add_argument("-m", "--module", action="store_true", help="TARGET is a module (python -m)")
    s.add_argument(
        "--no-python", "--no_python", action="store_true", help="TARGET is an executable, run without python"
    )
    # torchrun's other flags, in both spellings: mapped, or accepted with a note (elasticctl.torchrun).
    torchrun.add_flags(s, skip=frozenset({"nnodes", "nproc_per_node", "max_restarts", "module", "no_python"}))
    s.add_argument("target", metavar="SCRIPT.py|MODULE|EXE")
    s.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- ARGS")
    s.set_defaults(func=cmd_submit, local_ranks=None)

    status_cmd.add_arguments(add("status", help="show one job, or all jobs (filters, JSON, ids, --watch)"))

    k = add("kill", help="kill a job and every process it started")
    k.add_argument("job")
    k.set_defaults(func=cmd_kill)

    r = add("rm", help="remove an ended job: its records, and its logs (kept for job_retention otherwise)")
    r.add_argument("job")
    r.set_defaults(func=cmd_rm)

    logs_cmd.add_parser(add)
    events_cmd.add_parser(add)

    n = add("nodes", help="list the cluster's live nodes")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=cmd_nodes)

    dr = add("drain", help="make a node leave its jobs gracefully and take no new ones")
    dr.add_argument("node")
    dr.add_argument("--job", default=default(DrainArgs, "job"), help="leave only this job")
    dr.add_argument(
        "--grace",
        type=float,
        default=default(DrainArgs, "grace_s"),
        help="seconds between SIGTERM and SIGKILL for its workers",
    )
    dr.add_argument(
        "--force",
        action="store_true",
        default=default(DrainArgs, "force"),
        help="drain even if a job falls below its minimum",
    )
    dr.set_defaults(func=cmd_drain)

    ud = add("undrain", help="let a drained node take jobs again")
    ud.add_argument("node")
    ud.add_argument("--job", default=default(UndrainArgs, "job"), help="only for this job")
    ud.set_defaults(func=cmd_undrain)

    pg = add("ping", help="check that the daemon answers")
    pg.add_argument("--json", action="store_true")
    pg.set_defaults(func=cmd_ping)

    cp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    cp.add_argument("shell", choices=completion.SHELLS)
    cp.epilog = "e.g. `source <(elasticctl completion bash)` in ~/.bashrc"
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "completion":  # needs no daemon
        print(completion.script(parser, ns.shell), end="")
        return 0
    client = Client(ns.socket or default_socket_path(), timeout_s=ns.timeout)
    codes = ExitCodes(EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DAEMON_ERROR)
    return guarded("elasticctl", client, lambda: int(ns.func(client, ns)), codes)
