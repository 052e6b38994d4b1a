"""Where the repository and the venv's tools (elasticd, elasticctl, torchrun, python) are."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def default_bin() -> Path:
    here = Path(sys.executable).parent
    if (here / "elasticd").exists() and (here / "torchrun").exists():
        return here
    return REPO / ".venv" / "bin"
