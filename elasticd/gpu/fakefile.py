"""A ``FakeNvml`` a test drives from outside the daemon's process: a JSON file re-read on change.

``{"topology": "dgx_like" | "pcie_only" | "two_sockets", "count": N, "node": "name",
"gpus": [{field: value} per GPU index, e.g. {"ecc_uncorrected": 1}], "xids": [[index, code], ...]}``.
An ``xids`` entry is delivered once (the file's list only grows). Only for tests: the daemon
reads it when its environment names it (``daemon.testhooks``: a root-chosen path, never a setting).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from elasticd.gpu import fake
from elasticd.gpu.fake import FakeGpu, FakeMig, FakeNvml

_BUILDERS = {"dgx_like": fake.dgx_like, "pcie_only": fake.pcie_only, "two_sockets": fake.two_sockets}
_FIELDS = {
    "used_mib", "utilization", "ecc_uncorrected", "retired_pending", "remap_pending", "remap_failed",
    "recovery_action", "name", "memory_mib", "cpus",
}  # fmt: skip


class FileNvml(FakeNvml):
    def __init__(self, path: Path) -> None:
        self._path = path
        spec = self._load()
        build = _BUILDERS.get(str(spec.get("topology", "pcie_only")), fake.pcie_only)
        base = build(int(spec.get("count", 1)), str(spec.get("node", "fake")))
        super().__init__(base.gpus, base.ancestor, base.nvlinked)
        self._seen: tuple[int, int] | None = None
        self._delivered = 0
        self._reload_lock = threading.Lock()
        self._apply(spec)

    def _load(self) -> dict[str, Any]:
        value = json.loads(self._path.read_text())
        return value if isinstance(value, dict) else {}

    def _call(self, name: str, handle: Any = None) -> FakeGpu | None:
        self._refresh()
        return super()._call(name, handle)

    def _refresh(self) -> None:
        with self._reload_lock:
            try:
                st = os.stat(self._path)
            except OSError:
                return
            if (st.st_mtime_ns, st.st_size) == self._seen:
                return
            try:
                spec = self._load()
            except (OSError, ValueError):
                return  # a write in progress: the next call reads it whole
            self._apply(spec)
            self._seen = (st.st_mtime_ns, st.st_size)

    def _apply(self, spec: dict[str, Any]) -> None:
        for gpu, changes in zip(self.gpus, spec.get("gpus", []), strict=False):
            for key, value in dict(changes).items():
                if key in _FIELDS:
                    setattr(gpu, key, tuple(value) if key == "cpus" else value)
                elif key == "mig":
                    gpu.mig = None if value is None else [FakeMig(str(u)) for u in value]
        xids = list(spec.get("xids", []))
        for index, code in xids[self._delivered :]:
            self.xid(int(index), int(code))
        self._delivered = max(self._delivered, len(xids))


def write(path: Path, spec: dict[str, Any]) -> None:
    """Replace the file whole (a reader never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, path)
