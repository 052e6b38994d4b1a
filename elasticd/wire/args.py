"""Every command's arguments: a frozen dataclass with its defaults. The daemon decodes a request
into it (``elasticd.control.params.parse_args``); the CLI builds its requests from it (``request``)
and takes its option defaults from it (``default``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from elasticd.terms.options import DEFAULT_JOIN_TIMEOUT_S, DEFAULT_LAST_CALL_S, StragglerPolicy
from elasticd.terms.state import JobState


@dataclass(frozen=True)
class NoArgs:
    pass


@dataclass(frozen=True)
class SubmitArgs:
    entry_kind: str  # an EntryKind value (checked by submit: a bad one is invalid_spec)
    entry: str
    cwd: str
    args: list[str] = field(default_factory=list)
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    nnodes: str = "1"  # N or MIN:MAX
    nproc_per_node: int = 1
    max_restarts: int = 3
    name: str | None = None
    stop_grace_s: float | None = None  # None: the daemon's own setting
    nodes: list[str] = field(default_factory=list)
    last_call_s: float = DEFAULT_LAST_CALL_S
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    memory_limit_bytes: int | None = None
    cpu_limit: float | None = None
    nofile: int | None = None
    hang_timeout: str | None = None  # SECONDS or "auto"; None: no hang detection
    max_same_failures: int = 3  # end the job after failing the same way this often; 0: never
    warm: bool = True  # fork workers from a per-job zygote that imported torch once
    preload: list[str] = field(default_factory=list)  # modules the zygote imports besides torch
    job_id: str | None = None  # a job id of the submitter's choosing (torchrun's --rdzv-id)
    priority: int = 0  # admission order among waiting jobs, higher first; above 0: root and admins only
    numa_binding: str | None = None  # node, socket, exclusive or core-complex (torchrun's --numa-binding)
    mig: bool = False  # run on MIG slices, not whole GPUs
    stragglers: StragglerPolicy = StragglerPolicy.REPORT  # report, or also drain a straggler's node
    node_check: bool | None = None  # check nodes before each round; None: the daemon's default
    master_port: int | None = None  # torchrun's --master-port: the ranks' store listens there (None: picked)
    yields: bool = True  # an elastic job lends nodes above its MIN to a waiting higher priority


@dataclass(frozen=True)
class CheckArgs:
    nodes: list[str] = field(default_factory=list)  # the nodes to check ([]: every live node)


@dataclass(frozen=True)
class RmArgs:
    job: str  # a job that has ended: its records and this node's logs of it are deleted


@dataclass(frozen=True)
class StatusArgs:
    job: str | None = None  # None: every job (the filters below apply to that list only)
    states: list[JobState] = field(default_factory=list)  # only jobs in one of these states ([]: any)
    user: str | None = None  # only this user's jobs
    # Every job as a ``JobRow`` (what the table and the ids show), not a ``JobView``: a few times
    # fewer bytes to send and to decode (a queue of a thousand jobs: ~830 KB of views). Anyone
    # who may ask for ``status`` may ask for rows: they show a part of the views.
    rows: bool = False


@dataclass(frozen=True)
class KillArgs:
    job: str


@dataclass(frozen=True)
class LogsArgs:
    job: str
    rank: int | None = None  # only this global rank
    cursor: dict[str, int] = field(default_factory=dict)  # from the previous reply
    attempt: int | None = None  # only this attempt (None: every one)
    since: float | None = None  # only attempts that started (here) at or after this time, epoch seconds
    tail: int | None = None  # logs the cursor does not name start at their rank's last N lines
    partial: bool = False  # send unfinished lines too (a progress bar's ``\r`` updates), not whole lines only

    def __post_init__(self) -> None:
        for name in ("rank", "attempt", "tail"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"argument {name!r} must be >= 0, got {value}")


@dataclass(frozen=True)
class DrainArgs:
    node: str
    job: str | None = None  # None: every job of the node
    grace_s: float | None = None
    force: bool = False


@dataclass(frozen=True)
class UndrainArgs:
    node: str
    job: str | None = None
    gpu: str | None = None  # return this GPU (its UUID) to the node's pool instead


def default(args: type[Any], name: str) -> Any:
    """The default of argument ``name`` of an argument dataclass (a fresh one for lists and dicts)."""
    for f in dataclasses.fields(args):
        if f.name != name:
            continue
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        raise ValueError(f"{args.__name__}.{name} is required: it has no default")
    raise ValueError(f"{args.__name__} has no argument {name!r}")


def request(args: Any) -> dict[str, Any]:
    """The ``args`` object of a request: the fields that differ from their defaults (the daemon
    fills in the rest from the same dataclass, so older daemons still read what newer CLIs send
    unless a new option is used)."""
    if not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise TypeError(f"{args!r} is not an argument dataclass")
    out = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required or value != default(type(args), f.name):
            out[f.name] = value
    return out
