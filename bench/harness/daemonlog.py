"""The daemon's JSON log records, as a bench prints them."""

from __future__ import annotations

import json


def render_daemon_line(line: str, indent: str) -> str:
    """A JSON log record on one line, with its ``exception`` traceback (if any) unfolded below."""
    try:
        rec = json.loads(line)
    except ValueError:
        return indent + line
    if not isinstance(rec, dict) or "exception" not in rec:
        return indent + line
    exc = str(rec.pop("exception"))
    return indent + json.dumps(rec) + "".join(f"\n{indent}  | {x}" for x in exc.splitlines())
