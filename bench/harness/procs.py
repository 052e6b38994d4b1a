"""The processes a bench starts, and finding and killing what they left.

Every launcher runs in a session of its own (its process group can be signalled as a whole); the
ones still running are in ``live``, so an interrupted bench can stop them. A bench marks what it
starts (its temp dir, its node ids on their command lines), and ``sweep`` kills whatever carries
a marker at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from harness.paths import REPO

live: set[subprocess.Popen[bytes]] = set()  # launcher processes to kill if we are interrupted


def popen(argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,  # its own process group: we can kill the whole tree
        )
    live.add(proc)
    return proc


def killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace_s``.

    Signals go to the group only while its leader is alive and unreaped (so the group id cannot
    have been reused by someone else); stragglers are left to ``sweep``, which finds our
    processes by the temp dir in their command lines.
    """
    if proc.poll() is None:
        killpg(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    if proc.poll() is None:
        killpg(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    live.discard(proc)


def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code, or None if it did not exit within ``timeout_s``."""
    try:
        rc = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None
    live.discard(proc)
    return rc


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _marked(arg: str, marker: str) -> bool:
    """``arg`` is ``marker`` or a path under it (``--x=DIR/...`` too), or ``marker`` is a word in
    it; never a mere prefix match (another run's /tmp/elasticd-bench-abc-2 is not ours)."""
    if marker.startswith("/"):
        return arg == marker or marker + "/" in arg or arg.endswith("=" + marker)
    return marker in arg.replace("=", " ").split()


def own_processes(markers: list[str]) -> list[tuple[int, str]]:
    """Processes whose command line carries one of ``markers`` (our temp dir, our node id)."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        argv = _cmdline(int(entry))
        if argv and any(_marked(a, m) for m in markers for a in argv):
            found.append((int(entry), " ".join(argv)))
    return found


def sweep(markers: list[str], wait_s: float = 0.0) -> list[str]:
    """Give our leftovers ``wait_s`` to go, then SIGKILL them; returns what was killed."""
    deadline = time.monotonic() + wait_s
    while own_processes(markers) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = []
    for pid, cmd in own_processes(markers):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(f"{pid} {cmd}")
    return killed
