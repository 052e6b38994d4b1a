"""``elasticrun``: torchrun's command line, run by the local elasticd.

Replace the word ``torchrun`` by ``elasticrun`` in a command line or an sbatch script: the job is
submitted to the local daemon with torchrun's defaults (``--nnodes 1:1``, ``--nproc-per-node 1``,
``--max-restarts 0``), followed until it ends, and elasticrun exits as torchrun would: 0 when
every worker succeeded, 1 when the job failed. Ctrl-C (or SIGTERM, SIGHUP, SIGQUIT) stops the
job, as torchrun's does; a further signal while it stops changes nothing (``runsignals``). With
``--rdzv-id``, every node that runs the same line joins one job. Flags elasticd does not need are
accepted with a one-line note; see ``elasticctl.torchrun``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import signal
import sys
from collections.abc import Callable
from types import FrameType

from elasticctl import runsignals
from elasticctl.client import Client, DaemonError, ExitCodes, guarded, local_gpus
from elasticctl.entry import UsageError, resolve_entry
from elasticctl.torchrun import add_elasticd_flags, add_flags, interpret
from elasticd import __version__
from elasticd.control.address import default_socket_path
from elasticd.terms.options import StragglerPolicy
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
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Stop(Exception):
    """A signal asked us to stop the job (raised once, by ``SignalGate``, into the following)."""


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
        stragglers=StragglerPolicy(ns.stragglers),
        node_check=ns.node_check,
        yields=ns.yields,
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


class SignalGate:
    """Carries out ``runsignals.react`` for each stop signal: the one place that raises ``Stop``,
    and only once. It moves from phase to phase with the signals blocked, so that none lands
    between its read of the phase and its write."""

    def __init__(self) -> None:
        self.now = runsignals.Stops()

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.now, act = runsignals.react(self.now, name)
        if act is runsignals.Act.INTERRUPT:
            raise Stop(name)
        if act is runsignals.Act.TELL:
            # os.write, not print: the handler may run inside a print to stderr, which a second
            # print into the same buffer would refuse ("reentrant call").
            with contextlib.suppress(OSError):
                os.write(sys.stderr.fileno(), runsignals.told(self.now, name).encode())

    def _move(self, to: Callable[[runsignals.Stops], runsignals.Stops]) -> runsignals.Stops:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.now = to(self.now)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return self.now

    def following(self, job: str) -> None:
        """From here a signal interrupts the following; one that came during the submit does now."""
        if self._move(lambda now: runsignals.following(now, job)).phase is runsignals.Phase.STOPPING:
            raise Stop(self.now.why)

    def ended(self) -> None:
        self._move(runsignals.ended)


def submit(client: Client, args: SubmitArgs) -> JobView:
    """The job this line runs: submitted, or another node's identical line's (``--rdzv-id``)."""
    try:
        job: JobView = client.request("submit", args)
    except DaemonError as exc:
        if exc.code != ErrorCode.CONFLICT or args.job_id is None:
            raise
        job = joinable(client.request("status", StatusArgs(args.job_id))["job"], pwd_name())
        print(f"elasticrun: joining job {job['id']}, submitted by another node", file=sys.stderr)
    return job


def run(client: Client, ns: argparse.Namespace) -> int:
    gate = SignalGate()
    gate.install()
    args, local_ranks, notes = submit_args(ns, client)
    for note in notes:
        print(f"elasticrun: {note}", file=sys.stderr)
    job = submit(client, args)
    job_id = job["id"]
    print(f"elasticrun: job {job_id} ({job['state']})", file=sys.stderr)
    from elasticctl.follow import FollowOptions, follow  # after the request: not on its path

    nproc = args.nproc_per_node
    show = (lambda rank: rank % nproc in local_ranks) if local_ranks is not None else None
    try:
        gate.following(job_id)
        follow(client, job_id, FollowOptions(show=show, life=True, prog="elasticrun"))
        gate.ended()
    except Stop as exc:
        return stop(client, job_id, str(exc))
    return outcome(client, job_id)


def stop(client: Client, job_id: str, sig: str) -> int:
    """Stop the job a signal asked us to stop; torchrun's status for it (130), or the job's own
    when it had ended before the kill reached it."""
    print(f"\nelasticrun: {runsignals.name_of(sig)}: stopping job {job_id}", file=sys.stderr)
    try:
        reply: JobReply = client.request("kill", KillArgs(job_id), timeout_s=max(60.0, client.timeout_s))
    except DaemonError as exc:
        if exc.code != ErrorCode.CONFLICT:
            raise
        return outcome(client, job_id)
    print(f"elasticrun: {job_id} {reply['job']['state']}", file=sys.stderr)
    return EXIT_INTERRUPTED


def outcome(client: Client, job_id: str) -> int:
    """How elasticrun exits for a job that ended: 0 when it SUCCEEDED, else 1 with why."""
    from elasticctl import render  # after the requests (as elasticctl submit --follow): not on their path

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
