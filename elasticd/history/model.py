"""One cluster event as it is stored in etcd (``events/<seq>``), and the limits that keep it small.

Events are read back by any daemon and shown to users, so each is decoded with the same typed
decoder as every other record (``elasticd.decode``): a bad one is skipped with its reason, never
trusted. ``kind`` is a plain word rather than an enum so that a daemon of an older version reads
the kinds a newer one adds (it shows them as they are).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from elasticd.decode import decode
from elasticd.terms.ids import valid_job_id, valid_node_id

MAX_MESSAGE = 500  # characters of the one-line summary
MAX_FIELDS = 16
MAX_FIELD_TEXT = 300  # characters of one string field
_KIND = re.compile(r"^[a-z][a-z_]{0,39}$")
_FIELD = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True)
class ClusterEvent:
    """Something that happened in the cluster: a submit, a join, a round, a failure, a drain, ...

    ``fields`` holds the event's details (round, reason, cause, ...): flat, scalar, bounded."""

    time: float  # seconds since the epoch, on the recording node's clock
    kind: str  # EventKind's value (or a newer daemon's kind)
    job: str | None = None
    node: str | None = None  # the node it happened on or to
    message: str = ""  # for people: one line
    fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time) and self.time >= 0):
            raise ValueError("time must be seconds since the epoch")
        if not _KIND.match(self.kind):
            raise ValueError(f"kind {self.kind[:40]!r} is not a lower-case word")
        if self.job is not None and not valid_job_id(self.job):
            raise ValueError("job is not a valid job id")
        if self.node is not None and not valid_node_id(self.node):
            raise ValueError("node is not a valid node id")
        if len(self.message) > MAX_MESSAGE or "\n" in self.message:
            raise ValueError(f"message must be one line of at most {MAX_MESSAGE} characters")
        if len(self.fields) > MAX_FIELDS:
            raise ValueError(f"at most {MAX_FIELDS} fields")
        for name, value in self.fields.items():
            if not _FIELD.match(name):
                raise ValueError(f"field name {name[:40]!r} is not a lower-case word")
            if not _scalar(value):
                raise ValueError(f"field {name!r} must be a short string, a number, a bool or null")

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "kind": self.kind,
            "job": self.job,
            "node": self.node,
            "message": self.message,
            "fields": dict(self.fields),
        }

    @classmethod
    def from_json(cls, data: Any) -> ClusterEvent:
        return decode(cls, data)


def _scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_FIELD_TEXT


def clip(value: Any) -> Any:
    """``value`` made storable as a field: long text cut, lists joined, anything else as text."""
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not _scalar(value):
        text = str(value)
        return text if len(text) <= MAX_FIELD_TEXT else text[: MAX_FIELD_TEXT - 3] + "..."
    return value


def one_line(text: str) -> str:
    """``text`` as a message: one line, bounded."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 3] + "..."
