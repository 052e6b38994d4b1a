"""``elasticrun``: torchrun's command line, run by the local elasticd.

Replace the word ``torchrun`` by ``elasticrun`` in a command line or an sbatch script: the job is
submitted to the local daemon with torchrun's defaults (``--nnodes 1:1``, ``--nproc-per-node 1``,
``--max-restarts 0``), followed until it ends, and elasticrun exits as torchrun would: 0 when
every worker succeeded, 1 when the job failed. Ctrl-C (or SIGTERM, SIGHUP, SIGQUIT) stops the
job, as torchrun's does. With ``--rdzv-id``, every node that runs the same line joins one job.
Flags elasticd does not need are accepted with a one-line note; see ``elasticctl.torchrun``.
"""

from __future__ import annotations

import argparse
import os
import pwd
import signal
import sys
from types import FrameType

from elasticctl.client import Client, DaemonError, ExitCodes, guarded, local_gpus
from elasticctl.entry import UsageError, resolve_entry
from elasticctl.torchrun import add_elasticd_flags, add_flags, interpret
from elasticd import __version__
from elasticd.control.address import default_socket_path
from elasticd.wire import (
    ErrorCode,
    JobReply,
    JobState,
    JobView,
    KillArgs,
    StatusArgs,
    SubmitArgs,
    is_terminal,
)

EXIT_FAILED = 1  # torchrun's exit status for a failed job (ChildFailedError)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Stop(Exception):
    """A signal asked us to stop the job."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elasticrun",
        description="Run a torchrun command line through the local elasticd (every torchrun flag works).",
        allow_abbrev=False,
    )
    add_flags(p)
    add_elasticd_flags(p)
    p.add_argument(
        "--nodes",
        help="elasticd: comma-separated nodes allowed to take part (default: any; e.g. a Slurm "
        "allocation's, so that no daemon outside it takes a seat)",
    )
    p.add_argument("--version", action="version", version=f"elasticrun (elasticd) {__version__}")
    p.add_argument("training_script", metavar="SCRIPT.py|MODULE|EXE")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def submit_args(
    ns: argparse.Namespace, client: Client
) -> tuple[SubmitArgs, frozenset[int] | None, list[str]]:
    mapped = interpret(ns, lambda: local_gpus(client))
    cwd = os.getcwd()
    env = dict(os.environ)
    kind, entry, python = resolve_entry(ns.training_script, ns.module, ns.no_python, cwd, env, None)
    args = SubmitArgs(
        entry_kind=kind.value,
        entry=entry,
        cwd=cwd,
        args=list(ns.training_script_args),
        python=python,
        env=env,
        nnodes=str(ns.nnodes),
        nodes=[n.strip() for n in (ns.nodes or "").split(",") if n.strip()],
        max_restarts=int(ns.max_restarts),
        hang_timeout=ns.hang_timeout,
        max_same_failures=ns.max_same_failures,
        warm=ns.warm,
        preload=ns.preload,
        **mapped.fields,
    )
    return args, mapped.local_ranks, mapped.notes


def pwd_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def joinable(job: JobView, user: str) -> JobView:
    """The job another node's identical line (same ``--rdzv-id``) submitted, if this line may join
    it: it is the same user's, and it has not ended (a rerun must not report an old result)."""
    if job.get("user") != user:
        raise UsageError(f"--rdzv-id {job['id']} names a job of another user; choose another id")
    if is_terminal(job["state"]):
        raise UsageError(
            f"--rdzv-id {job['id']} names a job that has ended ({job['state']}); choose another id, "
            f"or remove it with `elasticctl rm {job['id']}`"
        )
    return job


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def run(client: Client, ns: argparse.Namespace) -> int:
    args, local_ranks, notes = submit_args(ns, client)
    for note in notes:
        print(f"elasticrun: {note}", file=sys.stderr)
    try:
        job: JobView = client.request("submit", args)
    except DaemonError as exc:
        if exc.code != ErrorCode.CONFLICT or args.job_id is None:
            raise
        job = joinable(client.request("status", StatusArgs(args.job_id))["job"], pwd_name())
        print(f"elasticrun: joining job {job['id']}, submitted by another node", file=sys.stderr)
    job_id = job["id"]
    print(f"elasticrun: job {job_id} ({job['state']})", file=sys.stderr)
    from elasticctl import render  # after the request (as elasticctl submit --follow): not on its path
    from elasticctl.follow import FollowOptions, follow

    nproc = args.nproc_per_node
    show = (lambda rank: rank % nproc in local_ranks) if local_ranks is not None else None
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        follow(client, job_id, FollowOptions(show=show, life=True, prog="elasticrun"))
    except (KeyboardInterrupt, Stop) as exc:
        why = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"\nelasticrun: {why}: stopping job {job_id}", file=sys.stderr)
        reply: JobReply = client.request("kill", KillArgs(job_id), timeout_s=max(60.0, client.timeout_s))
        print(f"elasticrun: {job_id} {reply['job']['state']}", file=sys.stderr)
        return EXIT_INTERRUPTED
    final = client.request("status", StatusArgs(job_id))["job"]
    if final["state"] == JobState.SUCCEEDED:
        return 0
    print(
        f"elasticrun: {job_id} {final['state']} after {final.get('restarts', 0)} restart(s)", file=sys.stderr
    )
    detail = render.failure(final) or final.get("reason", "")
    if detail:
        print(detail, file=sys.stderr)
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    client = Client(default_socket_path())
    return guarded(
        "elasticrun", client, lambda: run(client, ns), ExitCodes(EXIT_USAGE, EXIT_FAILED, EXIT_FAILED)
    )
