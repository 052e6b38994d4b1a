"""``elasticctl``'s command line: every command's options, and the argparse types that read them.

It is kept apart from the commands' implementations (``elasticctl.cli`` runs them) so that
parsing any command line imports none of them: ``elasticctl submit`` is on the path of every
job's start, and what it imports before its request leaves is start-up time. Every default of a
request's argument comes from its dataclass in ``elasticd.wire``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import time
from collections.abc import Callable
from pathlib import Path

from elasticctl.torchrun import add_elasticd_flags, add_flags
from elasticd import __version__
from elasticd.wire import (
    DrainArgs,
    EventsArgs,
    JobState,
    LogsArgs,
    StatusArgs,
    SubmitArgs,
    UndrainArgs,
    default,
)

SHELLS = ("bash", "zsh")  # what ``elasticctl completion`` writes a script for (elasticctl.completion)
WATCH_DEFAULT_S = 2.0  # ``status --watch`` with no SECONDS
# ``logs --since``: matched with re's cache, so a command line without it compiles neither.
_DURATION = r"(\d+(?:\.\d+)?)([smhd])"
_CLOCK = r"\d\d?:\d\d(:\d\d)?"
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


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


def _states(text: str) -> list[JobState]:
    """``--state RUNNING,pending``: job states, in any case."""
    out = []
    for word in text.split(","):
        try:
            out.append(JobState(word.strip().upper()))
        except ValueError:
            choices = ", ".join(s.value for s in JobState)
            raise argparse.ArgumentTypeError(f"{word.strip()!r} is not a job state ({choices})") from None
    return out


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"takes seconds between 0.1 and 86400, not {text!r}")
    return value


def count(what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= 0."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"{what} is an integer >= 0, not {text!r}")
        return value

    return parse


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``10m``, ``2h``, ``1d``), a local time today
    (``14:30``, ``14:30:05``) or a local date and time (``2025-05-01T14:30``); seconds since the epoch."""
    import datetime  # only here: other command lines do without it (~1 ms)

    now = time.time() if now is None else now
    if m := re.fullmatch(_DURATION, text.strip()):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    if re.fullmatch(_CLOCK, text.strip()):
        with contextlib.suppress(ValueError):
            today = datetime.datetime.fromtimestamp(now).date()
            return datetime.datetime.combine(today, datetime.time.fromisoformat(text.strip())).timestamp()
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()  # naive: local time
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"takes a duration (90s, 10m, 2h, 1d), a time (14:30) or a date and time "
            f"(2025-05-01T14:30), not {text!r}"
        ) from None


def _add_submit(add: Callable[..., argparse.ArgumentParser]) -> None:
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
    s.add_argument(
        "--priority",
        type=count("--priority"),
        default=job("priority"),
        metavar="N",
        help="start before waiting jobs of a lower priority, 0..1000 (above 0: root and admins only)",
    )
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


def _add_status(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("status", help="show one job, or all jobs (filters, JSON, ids, --watch)")
    p.add_argument("job", nargs="?", default=default(StatusArgs, "job"), metavar="JOB", help="one job")
    p.add_argument(
        "--state",
        dest="states",
        type=_states,
        default=default(StatusArgs, "states"),
        metavar="STATE[,STATE]",
        help="only jobs in these states (e.g. RUNNING,PENDING)",
    )
    p.add_argument("--user", default=default(StatusArgs, "user"), help="only this user's jobs")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="as JSON, times in ISO 8601 (UTC)")
    out.add_argument("-q", "--quiet", action="store_true", help="only job ids, one per line")
    p.add_argument(
        "--watch",
        nargs="?",
        type=_seconds,
        const=WATCH_DEFAULT_S,
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_DEFAULT_S:g}) until Ctrl-C (a JOB goes before it)",
    )


def _add_logs(add: Callable[..., argparse.ArgumentParser]) -> None:
    lg = add("logs", help="print a job's output (the ranks that ran on this node)")
    lg.add_argument("job")
    option = lg.add_argument
    option("--rank", type=count("a rank"), default=default(LogsArgs, "rank"), help="only this global rank")
    option("--attempt", type=count("an attempt"), default=default(LogsArgs, "attempt"),
           help="only this attempt (default: every one)")  # fmt: skip
    option("--tail", type=count("--tail"), default=default(LogsArgs, "tail"), metavar="N",
           help="start at each rank's last N lines")  # fmt: skip
    option("--since", type=parse_since, default=default(LogsArgs, "since"), metavar="WHEN",
           help="only attempts that started since WHEN: 10m, 2h, 14:30, 2025-05-01T14:30")  # fmt: skip
    option("-t", "--timestamps", action="store_true",
           help="prefix each line with the local time it was read (--:--:-- when unknown)")  # fmt: skip
    option("-f", "--follow", action="store_true",
           help="keep printing until the job ends; exit with its result")  # fmt: skip


def _add_events(add: Callable[..., argparse.ArgumentParser]) -> None:
    ev = add("events", help="the cluster's event history: submits, rounds, failures, drains, hangs")
    ev.add_argument("job", nargs="?", default=default(EventsArgs, "job"), metavar="JOB", help="only this job")
    ev.add_argument("-f", "--follow", action="store_true", help="keep printing new events until Ctrl-C")
    ev.add_argument("--json", action="store_true", help="JSON lines, times in ISO 8601 (UTC)")


def _add_nodes(add: Callable[..., argparse.ArgumentParser]) -> None:
    n = add("nodes", help="list the cluster's live nodes")
    n.add_argument("--json", action="store_true")

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

    ud = add("undrain", help="let a drained node take jobs again")
    ud.add_argument("node")
    ud.add_argument("--job", default=default(UndrainArgs, "job"), help="only for this job")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; ``ns.command`` names the command to run (``elasticctl.cli.COMMANDS``)."""
    p = argparse.ArgumentParser(prog="elasticctl", description="Control the local elasticd.")
    p.add_argument("--version", action="version", version=f"elasticctl {__version__}")
    _connection_options(p, after_command=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, after_command=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = functools.partial(sub.add_parser, parents=[common])

    _add_submit(add)
    _add_status(add)
    add("kill", help="kill a job and every process it started").add_argument("job")
    rm = add("rm", help="remove an ended job: its records, and its logs (kept for job_retention otherwise)")
    rm.add_argument("job")
    _add_logs(add)
    _add_events(add)
    _add_nodes(add)
    pg = add("ping", help="check that the daemon answers")
    pg.add_argument("--json", action="store_true")

    cp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    cp.add_argument("shell", choices=SHELLS)
    cp.epilog = "e.g. `source <(elasticctl completion bash)` in ~/.bashrc"
    return p
