"""Starting an elasticd for a bench: its own config, socket, state and logs under one folder."""

from __future__ import annotations

import subprocess
from pathlib import Path


def start_daemon(
    bin_dir: Path,
    root: Path,
    *,
    socket: Path,
    node_id: str,
    stop_grace_s: float,
    env: dict[str, str],
    err: Path,
    extra: list[str],
) -> subprocess.Popen[bytes]:
    """An elasticd in a session of its own (its workers can be signalled with it), its output
    in ``err``, with an empty config (everything comes from flags) and ``extra`` flags after the
    shared ones. Python's fault handler is on, so a SIGABRT dumps its threads."""
    config = root / "elasticd.toml"
    config.write_text("# empty: everything comes from flags\n")
    argv = [
        str(bin_dir / "elasticd"),
        "--config", str(config),
        "--allow-root-jobs",
        "--socket", str(socket),
        "--state-dir", str(root / "state"),
        "--log-dir", str(root / "logs"),
        "--node-id", node_id,
        "--log-format", "json",
        "--stop-grace", str(stop_grace_s),
        *extra,
    ]  # fmt: skip
    with open(err, "wb") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env | {"PYTHONFAULTHANDLER": "1"},
            cwd=root,
            start_new_session=True,
        )
