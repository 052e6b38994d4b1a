"""What a command line asks to run: a script, a module (``-m``) or an executable (``--no-python``),
and with which interpreter. Shared by ``elasticctl submit`` and ``elasticrun``."""

from __future__ import annotations

import os
import shutil
import sys

from elasticd.wire import EntryKind


class UsageError(Exception):
    """A command line that cannot be submitted; the message says why."""


def resolve_entry(
    target: str, module: bool, no_python: bool, cwd: str, env: dict[str, str], python: str | None
) -> tuple[EntryKind, str, str]:
    """(kind, entry, interpreter): a script is made absolute against ``cwd`` and must exist; the
    interpreter is ``python`` on the job's PATH (the submitter's venv), as torchrun would use."""
    if module and no_python:
        raise UsageError("-m and --no-python are mutually exclusive")
    if module:
        kind, entry = EntryKind.MODULE, target
    elif no_python:
        return EntryKind.EXEC, target, ""
    else:
        kind, entry = EntryKind.SCRIPT, os.path.join(cwd, target)
        if not os.path.isfile(entry):
            raise UsageError(f"script not found: {entry}")
    found = python or shutil.which("python", path=env.get("PATH") or os.environ.get("PATH"))
    found = found or shutil.which("python3") or sys.executable
    return kind, entry, os.path.abspath(found)
