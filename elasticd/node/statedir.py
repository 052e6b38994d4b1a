"""The daemon's own state on disk: a lock, the node id, and a record per job it runs.

The job records exist for one reason: after a crash, the next daemon knows which process groups
and slots its predecessor held, kills what is left and reports those jobs as failed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
from pathlib import Path
from typing import IO, Any

from elasticd.errors import ConfigError

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: IO[str] | None = None

    def open(self) -> None:
        """Create the directory and take its lock: one daemon per state dir."""
        (self.path / "jobs").mkdir(parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        self._lock = open(self.path / "lock", "w")  # noqa: SIM115 - held for the daemon's lifetime
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ConfigError(f"another elasticd is running with state dir {self.path}") from exc
        self._lock.write(str(os.getpid()))
        self._lock.flush()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def node_id(self, configured: str | None) -> str:
        """The configured id, else the one remembered here, else the short hostname (remembered)."""
        memo = self.path / "node_id"
        if configured:
            node = configured
        elif memo.is_file():
            node = memo.read_text().strip()
        else:
            node = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname().split(".")[0]) or "node"
        if not _NODE_ID.match(node):
            raise ConfigError(f"node id must match {_NODE_ID.pattern}, got {node!r}")
        if not memo.is_file() or memo.read_text().strip() != node:
            memo.write_text(node + "\n")
        return node

    def _job_file(self, job_id: str) -> Path:
        return self.path / "jobs" / f"{job_id}.json"

    def save_job(self, job_id: str, record: dict[str, Any]) -> None:
        tmp = self._job_file(job_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._job_file(job_id))

    def drop_job(self, job_id: str) -> None:
        self._job_file(job_id).unlink(missing_ok=True)

    def jobs(self) -> dict[str, dict[str, Any]]:
        out = {}
        for f in sorted((self.path / "jobs").glob("*.json")):
            try:
                out[f.stem] = json.loads(f.read_text())
            except (OSError, ValueError):
                f.unlink(missing_ok=True)
        return out
