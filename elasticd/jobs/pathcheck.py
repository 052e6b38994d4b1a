"""Checking a job's own paths (cwd, script, interpreter, executable) as its submitter.

A root daemon must never look at a user's paths with root's eyes: that would let a job read or
enter what only root may, and the difference between "missing" and "forbidden" would tell a user
what exists behind directories closed to them. So the check runs in a short-lived ``/bin/sh``
that has already switched to the submitter (uid, gid, supplementary groups), with the job's PATH,
inside the job's working directory: exactly what the workers will see, and one answer for
"missing or not accessible to you". ``--no-python ./run.sh`` is resolved against the job's cwd,
a bare name against the job's PATH, as ``exec`` will.

The shell gets every value as a positional argument, never inside the script text.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from enum import IntEnum

from elasticd.errors import InvalidSpec, ScriptNotFound
from elasticd.jobs.identity import switch_to
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec
from elasticd.terms.state import EndReason, SetupFailure

SHELL = "/bin/sh"
CHECK_TIMEOUT_S = 10.0

_SCRIPT = r"""
set -f
cd -- "$1" 2>/dev/null || exit 10
case "$2" in
script)
    [ -f "$3" ] && [ -r "$3" ] || exit 11 ;;
exec)
    case "$3" in
    */*) p=$3 ;;
    *) p=; IFS=:
       for d in $PATH; do
           [ -n "$d" ] || d=.
           if [ -f "$d/$3" ] && [ -x "$d/$3" ]; then p=$d/$3; break; fi
       done
       unset IFS ;;
    esac
    [ -n "$p" ] && [ -f "$p" ] && [ -x "$p" ] || exit 11 ;;
esac
if [ "$2" != exec ]; then
    [ -f "$4" ] && [ -x "$4" ] || exit 12
fi
exit 0
"""


class Problem(IntEnum):
    """What the check found wrong (the shell's exit status)."""

    CWD = 10
    ENTRY = 11
    INTERPRETER = 12


@dataclass(frozen=True)
class PathError:
    problem: Problem
    message: str

    def to_submit_error(self) -> InvalidSpec | ScriptNotFound:
        if self.problem is Problem.ENTRY:
            return ScriptNotFound(self.message)
        return InvalidSpec(self.message)

    def to_setup_failure(self, node: str) -> SetupFailure:
        reason = (
            EndReason.INTERPRETER_UNAVAILABLE
            if self.problem is Problem.INTERPRETER
            else EndReason.ENTRY_UNAVAILABLE
        )
        return SetupFailure(reason, f"on node {node}: {self.message}")


def _describe(spec: JobSpec, problem: Problem) -> str:
    who = f"user {spec.user}" if os.geteuid() == 0 else "you"
    match problem:
        case Problem.CWD:
            return f"working directory {spec.cwd} is missing or not accessible to {who}"
        case Problem.INTERPRETER:
            return f"python interpreter {spec.python} is missing or not executable by {who}"
        case Problem.ENTRY if spec.entry_kind is EntryKind.EXEC:
            return f"executable {spec.entry} is missing or not executable by {who} (in {spec.cwd})"
        case _:
            return f"script {spec.entry} is missing or not readable by {who}"


def check_paths(spec: JobSpec) -> PathError | None:
    """Run the check as the job's user; None when every path is usable. Blocks (use a thread)."""
    ident = switch_to(spec)
    env = {"PATH": spec.env.get("PATH", os.defpath)}
    argv = [SHELL, "-c", _SCRIPT, "elasticd-pathcheck", spec.cwd, spec.entry_kind.value, spec.entry]
    argv.append(spec.python)
    try:
        done = subprocess.run(
            argv,
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=CHECK_TIMEOUT_S,
            user=ident.uid if ident else None,
            group=ident.gid if ident else None,
            extra_groups=list(ident.groups) if ident else None,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return PathError(Problem.CWD, f"checking {spec.cwd} as {spec.user} timed out (a hung filesystem?)")
    if done.returncode == 0:
        return None
    try:
        problem = Problem(done.returncode)
    except ValueError:
        return PathError(Problem.CWD, f"could not check the job's paths as {spec.user} ({done.returncode})")
    return PathError(problem, _describe(spec, problem))
