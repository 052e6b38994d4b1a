"""The reaper sidecar: it outlives a crashed daemon just long enough to kill the daemon's workers.

The daemon starts it with a pipe on stdin and tells it ``track <pgid>`` / ``untrack <pgid>``.
When the pipe closes, the daemon is gone: if it exited cleanly there is nothing left to kill,
and if it was killed the reaper SIGKILLs every tracked process group and every process marked
with this node's owner marker, grandchildren included. Workers also carry a parent-death signal;
the reaper covers what that cannot: their own children.

Run as ``python -m elasticd.workers.reaper OWNER``. It sits in its own session and ignores
SIGINT/SIGTERM/SIGHUP so that a Ctrl-C or a stop aimed at the daemon does not take it first.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from elasticd.workers import proctree
from elasticd.workers.spawn import child_env


def main(argv: list[str]) -> int:
    owner = argv[1]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    tracked: set[int] = set()
    for line in sys.stdin:
        verb, _, arg = line.strip().partition(" ")
        if verb == "track" and arg.isdigit():
            tracked.add(int(arg))
        elif verb == "untrack" and arg.isdigit():
            tracked.discard(int(arg))
    proctree.kill_now(proctree.marked(owner), sorted(tracked))
    return 0


class Reaper:
    """The daemon's handle on its sidecar."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "elasticd.workers.reaper", self._owner],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=child_env(),
            close_fds=True,
        )

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def track(self, pgid: int) -> None:
        self._send(f"track {pgid}")

    def untrack(self, pgid: int) -> None:
        self._send(f"untrack {pgid}")

    def close(self) -> None:
        """Clean stop: everything is already down; the sidecar's final sweep finds nothing."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
