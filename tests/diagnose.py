"""What a test prints when a job does not end in time: every live process whose command line names
``marker``, its state and what its threads wait in, and the Python stacks of each (py-spy, when the
venv has it). A test that times out rarely says why by itself; the stacks do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

PY_SPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
DUMP_TIMEOUT_S = 10.0
MAX_PROCESSES = 16  # a dump per process costs about a second: enough to see what the job waits on


def stacks(marker: str) -> str:
    """A report on the processes whose command line contains ``marker`` ("" when none lives)."""
    found = [p for p in psutil.process_iter(["pid", "ppid", "status", "cmdline"]) if _names(p, marker)]
    return "\n".join(_report(p) for p in found[:MAX_PROCESSES])


def _names(proc: psutil.Process, marker: str) -> bool:
    return proc.pid != os.getpid() and any(marker in part for part in proc.info.get("cmdline") or ())


def _report(proc: psutil.Process) -> str:
    command = " ".join(proc.info["cmdline"])
    head = f"--- pid {proc.pid} (parent {proc.info['ppid']}, {proc.info['status']}): {command}"
    return "\n".join([head, _threads(proc.pid), _py_spy(proc.pid)])


def _threads(pid: int) -> str:
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            name, waits_in = (task / "comm").read_text().strip(), (task / "wchan").read_text()
            lines.append(f"  thread {task.name} {name} {state} {waits_in}")
        except OSError:
            continue
    return "\n".join(lines)


def _py_spy(pid: int) -> str:
    if PY_SPY is None:
        return "  (no py-spy: no Python stacks)"
    try:
        out = subprocess.run(
            [PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return "  (py-spy took too long)"
    return out.stdout + out.stderr
