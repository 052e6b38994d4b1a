"""What the workers of a bench_multi trial leave behind: first-collective stamps
(``bench/multi_worker.py``) and the training ledger (``examples/elastic_train.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

_STAMP = re.compile(r"^first\.r(\d+(?:\+\d+)?)\.(\d+)$")


@dataclass
class Stamp:
    round: str
    rank: int
    time: float
    world: int
    node: str
    pid: int
    launched: float  # the worker script started (before import torch)


def stamps(out: Path) -> list[Stamp]:
    """Every complete stamp (the .json is written after the time file, so both are there)."""
    found = []
    with contextlib.suppress(OSError):
        for p in out.iterdir():
            m = _STAMP.match(p.name)
            if not m:
                continue
            try:
                info = json.loads((out / (p.name + ".json")).read_text())
                found.append(Stamp(m.group(1), int(m.group(2)), float(info["time"]), int(info["world"]),
                                   str(info["node"]), int(info["pid"]), float(info["launched"])))  # fmt: skip
            except (OSError, ValueError, KeyError):
                continue
    return sorted(found, key=lambda s: s.time)


def world2_round(out: Path) -> list[Stamp] | None:
    """The stamps of the last round in which both ranks of a world of 2 did their first collective."""
    by_round: dict[str, dict[int, Stamp]] = {}
    for s in stamps(out):
        if s.world == 2:
            by_round.setdefault(s.round, {})[s.rank] = s
    full = [r for r in by_round.values() if sorted(r) == [0, 1]]
    return (
        sorted(max(full, key=lambda r: max(s.time for s in r.values())).values(), key=lambda s: s.rank)
        if full
        else None
    )


def parse_ledger(text: str) -> list[tuple[int, int]]:
    entries = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            entries.append((int(parts[0]), int(parts[1])))
    return entries


def read_ledger(path: Path) -> list[tuple[int, int]]:
    try:
        return parse_ledger(path.read_text())
    except OSError:
        return []


def read_ledger_stat(path: Path) -> tuple[list[tuple[int, int]], float | None]:
    """The ledger and the time of its last write: the mtime, if no write came between the fstat
    and the read (same size), else None."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except OSError:
        return [], None
    mtime = st.st_mtime_ns / 1e9 if len(data) == st.st_size else None
    return parse_ledger(data.decode(errors="replace")), mtime


def round_key(label: str) -> tuple[int, int]:
    base, _, extra = label.partition("+")
    return int(base), int(extra or 0)
