"""Samples of a running rank, taken only while a hang watch runs: the CPU time of its process
tree (cheap: /proc, about once a second) and its Python stacks (py-spy, only for a rank that
looks stalled, so a healthy job costs close to nothing).

py-spy attaches to the worker, which the job controls: it runs as the job's user (the identity
the worker itself runs as, never root), with a time limit and a bounded output, and what it
prints is checked by ``stacks.parse_dump``. Without py-spy, or when it fails, the caller is told
why and goes on without stacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from elasticd.progress.stacks import StackError, ThreadStack, parse_dump
from elasticd.terms.state import describe_exit
from elasticd.workers.proctree.spawn import Identity, worker_preexec

PY_SPY_TIMEOUT_S = 15.0
MAX_OUTPUT = 4 << 20
MAX_ERROR = 4096
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` and its descendants (and of children they reaped);
    None when ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def py_spy_path() -> str | None:
    """py-spy next to the daemon's interpreter (its venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


@dataclass(frozen=True)
class Dump:
    threads: tuple[ThreadStack, ...] | None  # None: unavailable, see ``error``
    error: str = ""


async def _read_bounded(stream: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_OUTPUT:
        chunk = await stream.read(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_OUTPUT:
        raise StackError(f"more than {MAX_OUTPUT} bytes of output")
    return b"".join(chunks)


async def _read_head(stream: asyncio.StreamReader, keep: int = MAX_ERROR) -> bytes:
    """The first ``keep`` bytes of everything ``stream`` says (the rest is read and dropped, so
    the writer never blocks on a full pipe)."""
    head = b""
    while chunk := await stream.read(65536):
        if len(head) < keep:
            head = (head + chunk)[:keep]
    return head


def failed(code: int, err: bytes) -> str:
    """Why py-spy gave no stacks: what it said, and a signal that ended it (before its exec, too)."""
    said = " ".join(err.decode(errors="replace").split())[:300]
    if code < 0:
        return describe_exit(code) + (f": {said}" if said else "")
    return said or describe_exit(code)


async def dump_stacks(pid: int, identity: Identity | None, timeout_s: float = PY_SPY_TIMEOUT_S) -> Dump:
    """The stacks of every thread of ``pid``, as ``identity`` (the worker's) may see them."""
    exe = py_spy_path()
    if exe is None:
        return Dump(None, "py-spy is not installed")
    try:
        proc = await asyncio.create_subprocess_exec(
            exe, "dump", "--pid", str(pid), "--json",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_ENV,
            preexec_fn=worker_preexec("/", identity),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return Dump(None, f"cannot run py-spy: {exc}")
    assert proc.stdout is not None and proc.stderr is not None
    try:
        out, err = await asyncio.wait_for(
            asyncio.gather(_read_bounded(proc.stdout), _read_head(proc.stderr)), timeout_s
        )
        code = await asyncio.wait_for(proc.wait(), timeout_s)
    except (TimeoutError, StackError) as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return Dump(None, f"py-spy: {exc or 'no answer within ' + str(timeout_s) + ' s'}")
    if code != 0:
        return Dump(None, f"py-spy: {failed(code, err)}")
    try:
        return Dump(parse_dump(out))
    except StackError as exc:
        return Dump(None, f"py-spy: {exc}")
