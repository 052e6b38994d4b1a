"""Where the control socket lives; shared by the daemon and the CLI so that both agree."""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_ENV = "ELASTICD_SOCKET"


def default_socket_path() -> Path:
    """``$ELASTICD_SOCKET``, else ``/run/elasticd/control.sock`` as root, else under ``$XDG_RUNTIME_DIR``.

    A non-root daemon without ``XDG_RUNTIME_DIR`` falls back to ``/tmp/elasticd-<uid>/``.
    """
    override = os.environ.get(SOCKET_ENV)
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path("/run/elasticd/control.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "elasticd" if runtime else Path(f"/tmp/elasticd-{os.geteuid()}")
    return base / "control.sock"


def endpoint(path: Path) -> str:
    return f"ipc://{path}"
