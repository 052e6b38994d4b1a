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


def cause(rec: dict[str, object]) -> tuple[str, str]:
    """A warning's group: its event and the last line of its exception (else its summary)."""
    last = str(rec.get("exception", "")).strip().splitlines()[-1:]
    return str(rec.get("event")), (last or [str(rec.get("summary", rec.get("reason", "")))])[0][:160]


def print_groups(title: str, groups: dict[tuple[str, str], list[str]]) -> None:
    """Each group of warnings, the largest first, with its first record unfolded."""
    if not groups:
        return
    print(f"\n{title}")
    for (event, what), lines in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(lines)}x {event}: {what}")
        print(render_daemon_line(lines[0], "    "))


def print_not_json(lines: list[str], most: int = 40) -> None:
    """The daemon's stderr lines that are not log records (a traceback that escaped, a crash)."""
    if not lines:
        return
    print(f"\nelasticd stderr lines that are not JSON log records ({len(lines)}):")
    for line in lines[:most]:
        print(f"  {line}")
    if len(lines) > most:
        print(f"  ... {len(lines) - most} more in the JSON output")
