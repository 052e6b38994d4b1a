"""A job's head: the small, bounded part of its spec that every daemon reads, in ``jobs/<job>/spec``.

The full ``JobSpec`` (its environment above all: tens of KiB) is stored apart, in ``specs/<job>``,
and read only by a node that is about to take part in the job. Everything else a daemon does
with every job (the scan and admission, the janitor, ``status``, permission checks) needs only
who owns the job, how many nodes and slots it takes, where it may run and its round timings:
that is the head. So a daemon's cost follows the jobs it runs, not the bytes that queued jobs
hold in etcd.

The head is derived from the spec (``JobHead.of``) and written with it in one transaction; the
node that reads the spec checks that it agrees with the head (``check_body``): a spec written
around the daemon that disagrees with the head it was admitted by fails the job
(``invalid_record``), never the daemon. The head's size has a hard bound (``MAX_HEAD_BYTES``),
checked before it is decoded, whatever the spec holds: ``argv`` is cut for display
(``argv_cut``), and ``nodes`` has the spec's own bound (``MAX_ALLOWED_NODES``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from elasticd.decode import DecodeError, Unknown, decode, parse_json
from elasticd.errors import InvalidSpec
from elasticd.terms.ids import JOB_ID, NAME, valid_node_id
from elasticd.terms.options import MAX_PRIORITY
from elasticd.terms.spec import MAX_ALLOWED_NODES, MAX_ID, MAX_NPROC_PER_NODE, USER, JobSpec, NodeRange

ARGV_ITEMS = 12  # the head keeps this many items of the command line, for display
ARGV_ITEM_CHARS = 120  # and this much of each
CUT = "…"
# The most a stored head can take: 256 node ids of 63 characters, 12 argv items of 120 characters
# each escaped as \uXXXX, and the rest (about 25 KiB in all). Checked before it is parsed.
MAX_HEAD_BYTES = 32 * 1024
MAX_SPEC_BYTES = 16 << 20  # ``spec_bytes`` sanity bound: etcd refuses values of more than ~1.5 MiB


def display_argv(argv: list[str]) -> tuple[tuple[str, ...], bool]:
    """``argv`` bounded for display: at most ``ARGV_ITEMS`` items (the last one then says how many
    more there were), each cut to ``ARGV_ITEM_CHARS`` (ending in ``CUT``); and whether it was cut."""
    items = [a if len(a) <= ARGV_ITEM_CHARS else a[: ARGV_ITEM_CHARS - 1] + CUT for a in argv]
    if len(items) > ARGV_ITEMS:
        items = [*items[: ARGV_ITEMS - 1], f"{CUT} ({len(argv) - ARGV_ITEMS + 1} more)"]
    return tuple(items), tuple(items) != tuple(argv)


@dataclass(frozen=True)
class JobHead:
    """What every daemon knows of a job without its full spec (module doc). Immutable, like the spec."""

    id: str
    name: str
    user: str
    uid: int
    gid: int
    nnodes: NodeRange
    nproc_per_node: int
    nodes: tuple[str, ...]  # nodes allowed to take part; empty: any
    submitted_at: float
    submitted_on: str
    priority: int
    max_restarts: int
    join_timeout_s: float
    last_call_s: float
    stop_grace_s: float
    max_same_failures: int
    hang_timeout_s: float | None
    hang_timeout_auto: bool
    argv: tuple[str, ...]  # the workers' command line, bounded for display (``display_argv``)
    argv_cut: bool
    spec_bytes: int  # the stored size of the full spec (``specs/<job>``)
    mig: bool = False  # the job runs on MIG slices only (whole GPUs only when False)
    yields: bool = True  # it lends nodes above its MIN to a waiting higher priority (jobs.room)

    def __post_init__(self) -> None:
        if not (isinstance(self.id, str) and JOB_ID.match(self.id)):
            raise InvalidSpec(f"id must match {JOB_ID.pattern}")
        if not (isinstance(self.name, str) and NAME.match(self.name)):
            raise InvalidSpec(f"name must match {NAME.pattern}")
        if not (isinstance(self.user, str) and USER.match(self.user)):
            raise InvalidSpec("user must be a plain user name")
        for name in ("uid", "gid"):
            if not 0 <= getattr(self, name) <= MAX_ID:
                raise InvalidSpec(f"{name} must be 0..{MAX_ID}")
        if not 1 <= self.nproc_per_node <= MAX_NPROC_PER_NODE:
            raise InvalidSpec(f"nproc_per_node must be 1..{MAX_NPROC_PER_NODE}")
        if len(self.nodes) > MAX_ALLOWED_NODES or not all(valid_node_id(n) for n in self.nodes):
            raise InvalidSpec(f"nodes must be at most {MAX_ALLOWED_NODES} node ids")
        if self.submitted_on and not valid_node_id(self.submitted_on):
            raise InvalidSpec("submitted_on must be a node id")
        self._check_numbers()
        if len(self.argv) > ARGV_ITEMS or any(len(a) > ARGV_ITEM_CHARS for a in self.argv):
            raise InvalidSpec(f"argv must be at most {ARGV_ITEMS} items of {ARGV_ITEM_CHARS} characters")

    def _check_numbers(self) -> None:
        checks = {
            "submitted_at": math.isfinite(self.submitted_at),
            "priority": 0 <= self.priority <= MAX_PRIORITY,
            "max_restarts": 0 <= self.max_restarts <= 10_000,
            "max_same_failures": 0 <= self.max_same_failures <= 10_000,
            "join_timeout_s": 0 < self.join_timeout_s <= 86400,
            "last_call_s": 0 <= self.last_call_s <= 3600,
            "stop_grace_s": 0 <= self.stop_grace_s <= 3600,
            "hang_timeout_s": self.hang_timeout_s is None or 0 < self.hang_timeout_s <= 86400,
            "spec_bytes": 0 < self.spec_bytes <= MAX_SPEC_BYTES,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise InvalidSpec(f"{bad[0]} is out of range")

    @classmethod
    def of(cls, spec: JobSpec, spec_bytes: int) -> JobHead:
        """The head of ``spec``, stored as ``spec_bytes`` bytes (``body_bytes``)."""
        argv, cut = display_argv(spec.argv)
        return cls(
            id=spec.id,
            name=spec.name,
            user=spec.user,
            uid=spec.uid,
            gid=spec.gid,
            nnodes=spec.nnodes,
            nproc_per_node=spec.nproc_per_node,
            nodes=spec.nodes,
            submitted_at=spec.submitted_at,
            submitted_on=spec.submitted_on,
            priority=spec.priority,
            max_restarts=spec.max_restarts,
            join_timeout_s=spec.join_timeout_s,
            last_call_s=spec.last_call_s,
            stop_grace_s=spec.stop_grace_s,
            mig=spec.mig,
            yields=spec.yields,
            max_same_failures=spec.max_same_failures,
            hang_timeout_s=spec.hang_timeout_s,
            hang_timeout_auto=spec.hang_timeout_auto,
            argv=argv,
            argv_cut=cut,
            spec_bytes=spec_bytes,
        )

    def allows(self, node: str) -> bool:
        return not self.nodes or node in self.nodes

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["nnodes"] = str(self.nnodes)
        out["nodes"] = list(self.nodes)
        out["argv"] = list(self.argv)
        if not self.mig:  # left out at its default: older daemons read the head still
            del out["mig"]
        if self.yields:  # (the same)
            del out["yields"]
        return out

    @classmethod
    def from_json(cls, data: Any) -> JobHead:
        """A decoded head, checked as strictly as a spec (unknown fields refused: ``JobSpec.from_json``)."""
        try:
            return decode(cls, data, unknown=Unknown.REJECT)
        except DecodeError as exc:
            raise InvalidSpec(f"malformed job head: {exc}") from None


def body_bytes(spec: JobSpec) -> bytes:
    """The spec as ``specs/<job>`` stores it (what ``spec_bytes`` counts)."""
    return json.dumps(spec.to_json(), separators=(",", ":")).encode()  # as ``KV`` encodes


def parse_head(raw: bytes) -> JobHead:
    """A stored head; DecodeError (or InvalidSpec) if it is too large or not a valid head."""
    if len(raw) > MAX_HEAD_BYTES:
        raise DecodeError("", f"the head is {len(raw)} bytes, more than {MAX_HEAD_BYTES}")
    return JobHead.from_json(parse_json(raw))


def check_body(head: JobHead, raw: bytes | None) -> JobSpec:
    """The full spec stored for ``head``'s job, if it is one and agrees with the head; else
    DecodeError saying why (the job fails for it: ``invalid_record``)."""
    if raw is None:
        raise DecodeError("", "missing: the job has a head but no spec")
    if len(raw) > MAX_SPEC_BYTES:
        raise DecodeError("", f"is {len(raw)} bytes, more than {MAX_SPEC_BYTES}")
    try:
        spec = JobSpec.from_json(parse_json(raw))
    except InvalidSpec as exc:
        raise DecodeError("", exc.message) from None
    derived = JobHead.of(spec, len(raw))
    differ = [f.name for f in fields(JobHead) if getattr(derived, f.name) != getattr(head, f.name)]
    if differ:
        raise DecodeError(differ[0], f"disagrees with the job's head ({', '.join(differ[:5])})")
    return spec
