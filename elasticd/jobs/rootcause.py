"""Which failed worker of a round is the root cause: the first to fail, by time. Pure: no I/O.

torchrun blames the failure with the smallest error-file timestamp; a worker without one (no
``@record``, a signal, ``os._exit``) is timed by when its exit was seen. The lowest rank is not
the root cause: after rank 1 crashes, rank 0 typically fails too, with gloo's "Connection closed
by peer" or NCCL's timeout, and blaming it hides the real error.

torch writes the timestamp in whole seconds, so failures are compared at that resolution first
and by when their exits were seen within a second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Exit:
    """One worker's exit, as the daemon saw it."""

    rank: int
    local_rank: int
    returncode: int
    exited_at: float  # when the exit was seen (seconds since the epoch)
    error_at: float | None = None  # the error file's timestamp, if the worker wrote one

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def failed_at(self) -> float:
        """The best estimate of when it failed: its own word, else when it was seen to exit."""
        return self.error_at if self.error_at is not None else self.exited_at


def order_key(e: Exit) -> tuple[float, float, int]:
    """Sort key, first failure first: the whole second it failed in (an error file's timestamp
    cannot be later than the exit: a clock step or a bogus value is bounded by it), then when the
    exit was seen, then the rank (only for exits seen at the very same instant)."""
    second = math.floor(e.exited_at)
    if e.error_at is not None:
        second = min(second, math.floor(e.error_at))
    return (second, e.exited_at, e.rank)


def by_first_failure(exits: Iterable[Exit]) -> list[Exit]:
    """The failed exits, root cause first."""
    return sorted((e for e in exits if e.failed), key=order_key)


def _timestamp(value: Any) -> float | None:
    """torch writes ``str(int(time.time()))``; accept numbers too, refuse anything else."""
    if isinstance(value, bool):
        return None
    try:
        ts = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return ts if math.isfinite(ts) and ts > 0 else None


def parse_error_file(data: Any) -> tuple[str, float | None]:
    """The message (its last line) and timestamp of a TORCHELASTIC_ERROR_FILE's JSON.

    torch's ``@record`` writes ``{"message": {"message": "Type: text", "extraInfo":
    {"py_callstack": "...", "timestamp": "<seconds>"}}}``; torchelastic also reads the older
    ``{"message": "text", "timestamp": <seconds>}``. Anything else gives ``("", None)``.
    """
    if not isinstance(data, dict):
        return "", None
    message = data.get("message", "")
    ts: Any = data.get("timestamp")
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        ts = extra.get("timestamp") if isinstance(extra, dict) else None
        message = message.get("message", "")
    text = str(message).strip() if message is not None else ""
    return (text.splitlines()[-1].strip() if text else ""), _timestamp(ts)
