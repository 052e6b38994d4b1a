"""What a bench run records besides its trials: the code it measured, the torch it ran, the load
on the machine, and how it ended."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM stops a bench as ^C does: through its clean-up."""
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class Run:
    """What one bench run records besides its trials: where, with what, and how it ended."""

    started: float
    load_before: tuple[float, float, float]
    torch_version: str
    source: dict[str, Any]  # the elasticd code measured (``code_source``)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    interrupted: bool = False
    aborted: str = ""

    def describe_source(self) -> str:
        desc = str(self.source.get("elasticd", self.source.get("error")))
        if "code_sha256" in self.source:
            desc += f" [code sha256 {self.source['code_sha256']}]"
        if "git_head" in self.source:
            n = len(self.source["uncommitted"])
            desc += f" (git {self.source['git_head']}, {n} uncommitted paths under elasticd/ and elasticctl/)"
        return desc

    def header(self) -> dict[str, Any]:
        """What a bench's JSON output says of the run before its own fields."""
        return {
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": self.torch_version,
                     "platform": platform.platform()},
            "started_at": self.started,
            "loadavg_start": self.load_before,
            "loadavg_end": self.load_after,
            "interrupted": self.interrupted,
            "elasticd_source": self.source,
        }  # fmt: skip


def loadavg_text(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def installed_torch() -> str:
    try:
        return importlib.metadata.version("torch")  # without importing torch here
    except importlib.metadata.PackageNotFoundError:
        return "?"


def code_source(python: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Which elasticd code ``python`` imports (PYTHONPATH may point at another checkout); run from
    ``cwd``, like the daemon: not the repo root, which would shadow PYTHONPATH."""
    probe = "import elasticd, elasticctl; print(elasticd.__file__); print(elasticctl.__file__)"
    out: dict[str, Any] = {"python": python}
    try:
        r = subprocess.run(
            [python, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
        )
        files = r.stdout.split()
    except subprocess.TimeoutExpired:
        files = []
    if len(files) != 2:
        return out | {"error": "cannot import elasticd"}
    pkg = Path(files[0]).parent
    out["elasticd"] = str(pkg)
    out["elasticctl"] = str(Path(files[1]).parent)
    root = pkg.parent
    digest = hashlib.sha256()
    for base in (pkg, Path(out["elasticctl"])):
        for f in sorted(base.rglob("*.py")):
            digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    out["code_sha256"] = digest.hexdigest()[:12]  # of elasticd/ + elasticctl/ *.py as measured

    def git(*args: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return r.stdout.strip()
        return ""

    if rev := git("rev-parse", "--short", "HEAD"):
        out["git_head"] = rev
        status = git("status", "--porcelain", "--", "elasticd", "elasticctl")
        out["uncommitted"] = status.splitlines()
    return out
