"""``elasticctl submit``: a job, torchrun-style; with ``--follow``, its output until it ends.

``elasticctl submit`` is on the path of every job's start: what it imports before its request
leaves is start-up time, so following the job is imported after the request.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

from elasticctl import torchrun
from elasticctl.client import Client, local_gpus
from elasticctl.commands.base import Command, count
from elasticctl.entry import UsageError, resolve_entry
from elasticctl.exits import EXIT_INTERRUPTED
from elasticctl.torchrun import add_elasticd_flags, add_flags
from elasticd.terms.options import StragglerPolicy
from elasticd.wire import JobState, JobView, SubmitArgs, WaitsFor, default


def _nproc(text: str) -> int | str:
    """``--nproc-per-node``: a number, or gpu, cpu or auto (resolved at submit, as torchrun does)."""
    if text.isdigit():
        return int(text)
    if text in ("gpu", "cpu", "auto"):
        return text
    raise argparse.ArgumentTypeError(f"takes a number, gpu, cpu or auto, got {text!r}")


def arguments(s: argparse.ArgumentParser) -> None:
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
    _limits(s, job)
    add_elasticd_flags(s)
    s.add_argument("--follow", "-f", action="store_true", help="stream output; exit with the job's result")
    s.add_argument("-m", "--module", action="store_true", help="TARGET is a module (python -m)")
    s.add_argument(
        "--no-python", "--no_python", action="store_true", help="TARGET is an executable, run without python"
    )
    # torchrun's other flags, in both spellings: mapped, or accepted with a note (elasticctl.torchrun).
    add_flags(s, skip=frozenset({"nnodes", "nproc_per_node", "max_restarts", "module", "no_python"}))
    s.add_argument("target", metavar="SCRIPT.py|MODULE|EXE")
    s.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- ARGS")
    s.set_defaults(local_ranks=None)


def _limits(s: argparse.ArgumentParser, job: Callable[[str], object]) -> None:
    """What a worker may use, and the job's place in the queue."""
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
    s.add_argument(
        "--mig",
        action="store_true",
        default=job("mig"),
        help="run each rank on a MIG slice of a partitioned GPU (default: on whole GPUs)",
    )
    s.add_argument(
        "--priority",
        type=count("--priority"),
        default=job("priority"),
        metavar="N",
        help="start before waiting jobs of a lower priority, 0..1000 (above 0: root and admins only)",
    )


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _memory_limit(text: str | None) -> int | None:
    if text is None:
        return None
    from elasticd.workers.cgroups.limits import parse_size  # the daemon's module: only for this option

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"--memory-limit: {exc}") from exc


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
        memory_limit_bytes=_memory_limit(ns.memory_limit),
        cpu_limit=ns.cpu_limit,
        nofile=ns.nofile,
        hang_timeout=ns.hang_timeout,
        max_same_failures=ns.max_same_failures,
        warm=ns.warm,
        preload=ns.preload,
        job_id=fields.get("job_id"),
        priority=ns.priority,
        numa_binding=fields.get("numa_binding"),
        master_port=fields.get("master_port"),
        mig=ns.mig,
        stragglers=StragglerPolicy(ns.stragglers),
        node_check=ns.node_check,
        yields=ns.yields,
    )
    return args, mapped


def run(client: Client, ns: argparse.Namespace) -> int:
    args, mapped = submit_request(ns, lambda: local_gpus(client))
    for note in mapped.notes:
        print(f"elasticctl: {note}", file=sys.stderr)
    job: JobView = client.request("submit", args)
    print(job["id"], flush=True)
    if not ns.follow:
        if job["state"] == JobState.PENDING and job.get("waits_for") == WaitsFor.CAPACITY:
            print(f"elasticctl: {job['id']} is PENDING: {job['reason']}", file=sys.stderr)
        return 0
    try:
        from elasticctl.follow import FollowOptions, exit_status, follow_to_end  # after the request
    except KeyboardInterrupt:  # Ctrl-C before following began: the job keeps running all the same
        print(f"\nelasticctl: stopped following; {job['id']} keeps running", file=sys.stderr)
        return EXIT_INTERRUPTED
    ranks, nproc = mapped.local_ranks, args.nproc_per_node
    show = (lambda rank: rank % nproc in ranks) if ranks is not None else None
    return exit_status(follow_to_end(client, job["id"], FollowOptions(show=show, life=True)))


COMMAND = Command("submit", "submit a job (torchrun-style entry point)", arguments, run)
