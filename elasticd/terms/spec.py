"""The job spec: immutable once submitted, stored verbatim in ``jobs/<id>/spec``.

Validation here is the only check a spec gets before it is accepted; a spec that passes can
always be attempted (whether the host has room is the scheduler's question, not the spec's).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from elasticd.decode import DecodeError, Unknown, decode
from elasticd.errors import InvalidSpec
from elasticd.terms.ids import JOB_ID, NAME, NODE_ID
from elasticd.terms.options import (
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_LAST_CALL_S,
    MAX_PRIORITY,
    MODULE_NAME,
    NUMA_BINDINGS,
    EntryKind,
    StragglerPolicy,
)

# A plain user name: what pwd may hold (or the uid as digits when it has no entry), nothing that
# could be read as a path, an option or a second field.
USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\$?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ID = 2**32 - 2  # uid/gid: (uid_t)-1 means "unchanged" to setresuid, never a user
MAX_NPROC_PER_NODE = 1024
MAX_NODES = 100_000  # a round's records stay O(1) per member (elasticd.rendezvous.roster)
MAX_ALLOWED_NODES = 256  # node ids a job may name in ``nodes`` (none: any node); its head holds them all
MIN_HANG_TIMEOUT_S = 1.0
MAX_HANG_TIMEOUT_S = 86400.0
MAX_PRELOAD = 32
MIN_MASTER_PORT = 1024
MIN_MEMORY = 16 << 20
MAX_MEMORY = 1 << 50


@dataclass(frozen=True)
class NodeRange:
    min: int
    max: int

    @classmethod
    def parse(cls, text: str) -> NodeRange:
        """``"2"`` or ``"1:4"`` (torchrun's ``--nnodes`` syntax)."""
        lo, sep, hi = str(text).partition(":")
        try:
            low, high = int(lo), int(hi) if sep else int(lo)
        except ValueError as exc:
            raise InvalidSpec(f"nnodes must be N or MIN:MAX, got {text!r}") from exc
        if not 1 <= low <= high <= MAX_NODES:
            raise InvalidSpec(f"nnodes must satisfy 1 <= MIN <= MAX <= {MAX_NODES}, got {text!r}")
        return cls(low, high)

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max <= MAX_NODES:
            raise InvalidSpec(f"nnodes must satisfy 1 <= MIN <= MAX <= {MAX_NODES}, got {self}")

    @classmethod
    def __decode__(cls, value: Any) -> NodeRange:
        """Stored as torchrun writes it (``"1:4"``), never as numbers."""
        if not isinstance(value, str):
            raise InvalidSpec(f"nnodes must be a string N or MIN:MAX, got {type(value).__name__}")
        return cls.parse(value)

    def __str__(self) -> str:
        return str(self.min) if self.min == self.max else f"{self.min}:{self.max}"


def parse_hang_timeout(text: str | None) -> tuple[float | None, bool]:
    """``--hang-timeout SECONDS|auto`` as the spec's (``hang_timeout_s``, ``hang_timeout_auto``);
    None or "" or "off": no hang detection. The range is checked with the rest of the spec."""
    if text is None or text.strip().lower() in ("", "off"):
        return None, False
    if text.strip().lower() == "auto":
        return None, True
    try:
        seconds = float(text)
    except ValueError:
        raise InvalidSpec(f"hang_timeout must be a number of seconds or auto, got {text[:40]!r}") from None
    if not math.isfinite(seconds):
        raise InvalidSpec(f"hang_timeout must be a finite number of seconds, got {text[:40]!r}")
    return seconds, False


def _exec_safe(text: str) -> bool:
    """Text that can be an argv element, a path or an environment entry: no NUL, valid UTF-8."""
    if "\0" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates, which JSON escapes can carry
        return False
    return True


@dataclass(frozen=True)
class JobSpec:
    id: str
    name: str
    entry_kind: EntryKind
    entry: str  # script path (absolute), module name, or executable
    args: tuple[str, ...]
    python: str  # interpreter for SCRIPT/MODULE entries, resolved on the submitter's PATH
    cwd: str
    env: dict[str, str] = field(hash=False)
    uid: int
    gid: int
    user: str
    nnodes: NodeRange
    nproc_per_node: int = 1
    max_restarts: int = 3
    stop_grace_s: float = 10.0
    submitted_at: float = 0.0
    nodes: tuple[str, ...] = ()  # nodes allowed to take part; empty: any
    last_call_s: float = DEFAULT_LAST_CALL_S
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    submitted_on: str = ""  # the node whose daemon took the submission
    memory_limit_bytes: int | None = None  # per worker (its whole process tree)
    cpu_limit: float | None = None  # CPUs per worker (cgroup quota; pinned cores without cgroups)
    nofile: int | None = None  # RLIMIT_NOFILE of every worker process
    hang_timeout_s: float | None = None  # a rank without progress this long hangs; None: see auto
    hang_timeout_auto: bool = False  # learn the hang timeout from the job's own step times
    max_same_failures: int = 3  # stop after failing the same way this often with no progress; 0: never
    warm: bool = True  # fork workers from a per-job zygote that imported torch once (workers.warm)
    preload: tuple[str, ...] = ()  # modules the zygote imports besides torch
    priority: int = 0  # admission order among pending jobs, higher first (above 0: root and admins)
    numa_binding: str | None = None  # torchrun's --numa-binding: node, socket, exclusive, core-complex
    mig: bool = False  # run on MIG slices (a MIG job), never on whole GPUs, and the other way round
    stragglers: StragglerPolicy = StragglerPolicy.REPORT  # what a straggler's node gets (progress.slowness)
    node_check: bool = False  # check every node before a round takes it in (rendezvous.fitness)
    master_port: int | None = None  # torchrun's --master-port: MASTER_PORT on every node (None: picked)
    yields: bool = True  # an elastic job lends nodes above its MIN to a waiting higher priority (jobs.room)

    def __post_init__(self) -> None:
        # In this order: a spec with several problems is told the first one.
        self._check_types()
        self._check_identity()
        self._check_text()
        self._check_run()
        self._check_placement()
        self._check_limits()
        self._check_hang_timeout()
        self._check_warm()
        bad = [k for k in self.env if not _ENV_KEY.match(k)]
        if bad:
            raise InvalidSpec(f"invalid environment variable names: {bad[:5]}")
        if type(self.priority) is not int or not 0 <= self.priority <= MAX_PRIORITY:
            raise InvalidSpec(f"priority must be an integer 0..{MAX_PRIORITY}, got {self.priority!r}")
        self._check_gpu()

    def _check_gpu(self) -> None:
        if self.numa_binding is not None and self.numa_binding not in NUMA_BINDINGS:
            raise InvalidSpec(
                f"numa_binding must be one of {', '.join(NUMA_BINDINGS)}, got {self.numa_binding[:40]!r}"
            )
        if type(self.mig) is not bool:
            raise InvalidSpec("mig must be true or false")
        if type(self.node_check) is not bool:
            raise InvalidSpec("node_check must be true or false")
        if type(self.yields) is not bool:
            raise InvalidSpec("yields must be true or false")
        if not isinstance(self.stragglers, StragglerPolicy):
            raise InvalidSpec(f"stragglers must be one of {', '.join(StragglerPolicy)}")

    def _check_types(self) -> None:
        for name in ("id", "name", "entry", "python", "cwd", "user"):
            if not isinstance(getattr(self, name), str):
                raise InvalidSpec(f"{name} must be a string")
        if not isinstance(self.env, dict) or not all(isinstance(v, str) for v in self.env.values()):
            raise InvalidSpec("env must map names to strings")
        if not isinstance(self.args, tuple) or not all(isinstance(a, str) for a in self.args):
            raise InvalidSpec("args must be a list of strings")

    def _check_text(self) -> None:
        """What reaches exec must be safe to pass there; ids and names must match their forms."""
        texts = [self.entry, self.python, self.cwd, *self.args, *self.env, *self.env.values()]
        if not all(_exec_safe(t) for t in texts):
            raise InvalidSpec("entry, python, cwd, args and env must not contain NUL or invalid UTF-8")
        if not JOB_ID.match(self.id):
            raise InvalidSpec(f"id must match {JOB_ID.pattern}, got {self.id[:80]!r}")
        if not NAME.match(self.name):
            raise InvalidSpec(f"name must match {NAME.pattern}, got {self.name!r}")

    def _check_run(self) -> None:
        """What each worker runs, how many per node, and how often the job may restart."""
        if not 1 <= self.nproc_per_node <= MAX_NPROC_PER_NODE:
            raise InvalidSpec(f"nproc_per_node must be 1..{MAX_NPROC_PER_NODE}, got {self.nproc_per_node}")
        if not 0 <= self.max_restarts <= 10_000:
            raise InvalidSpec(f"max_restarts must be 0..10000, got {self.max_restarts}")
        if not 0 <= self.max_same_failures <= 10_000:
            raise InvalidSpec(f"max_same_failures must be 0..10000, got {self.max_same_failures}")
        if not 0 <= self.stop_grace_s <= 3600:
            raise InvalidSpec(f"stop_grace_s must be 0..3600, got {self.stop_grace_s}")
        if not self.entry:
            raise InvalidSpec("an entry point (script, -m module, or --no-python executable) is required")
        if self.entry_kind is not EntryKind.EXEC and not self.python.startswith("/"):
            raise InvalidSpec(f"python must be an absolute path, got {self.python!r}")
        if not self.cwd.startswith("/"):
            raise InvalidSpec(f"cwd must be an absolute path, got {self.cwd!r}")
        if self.entry_kind is EntryKind.SCRIPT and not self.entry.startswith("/"):
            raise InvalidSpec(f"script must be an absolute path, got {self.entry!r}")

    def _check_placement(self) -> None:
        """Where and when the job's rounds form."""
        if not 0 <= self.last_call_s <= 3600 or not 0 < self.join_timeout_s <= 86400:
            raise InvalidSpec("last_call_s must be 0..3600 and join_timeout_s 0..86400 seconds")
        if len(self.nodes) > MAX_ALLOWED_NODES:
            raise InvalidSpec(
                f"nodes may name at most {MAX_ALLOWED_NODES} nodes, got {len(self.nodes)} (none: any node)"
            )
        if not all(isinstance(n, str) and NAME.match(n) for n in self.nodes):
            raise InvalidSpec(f"nodes must be node ids, got {list(self.nodes)[:10]}")
        if self.submitted_on and not NODE_ID.match(self.submitted_on):
            raise InvalidSpec(f"submitted_on must be a node id, got {self.submitted_on[:80]!r}")
        if not math.isfinite(self.submitted_at):
            raise InvalidSpec("submitted_at must be a finite time")
        port = self.master_port
        if port is not None and (type(port) is not int or not MIN_MASTER_PORT <= port <= 65535):
            # Below 1024 only root may listen, and the ranks and their store host are the submitter.
            raise InvalidSpec(f"master_port must be {MIN_MASTER_PORT}..65535, got {port!r}")

    def _check_limits(self) -> None:
        """Each worker's resource limits."""
        if self.memory_limit_bytes is not None and not MIN_MEMORY <= self.memory_limit_bytes <= MAX_MEMORY:
            raise InvalidSpec(f"memory_limit must be 16 MiB .. 1 PiB, got {self.memory_limit_bytes} bytes")
        if self.cpu_limit is not None and not 0.01 <= self.cpu_limit <= 4096:
            raise InvalidSpec(f"cpu_limit must be 0.01..4096 CPUs, got {self.cpu_limit}")
        if self.nofile is not None and not 16 <= self.nofile <= 1 << 20:
            raise InvalidSpec(f"nofile must be 16..{1 << 20}, got {self.nofile}")

    def _check_identity(self) -> None:
        """Whom the workers run as: a real uid/gid and a plain name. Whether this node may run
        them as that user (root, another user) is the node's decision, not the spec's."""
        for name in ("uid", "gid"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_ID:
                raise InvalidSpec(f"{name} must be an integer 0..{MAX_ID}, got {value!r}")
        if not USER.match(self.user):
            raise InvalidSpec(f"user must be a plain user name, got {self.user[:80]!r}")

    def _check_warm(self) -> None:
        if type(self.warm) is not bool:
            raise InvalidSpec("warm must be true or false")
        if not isinstance(self.preload, tuple) or len(self.preload) > MAX_PRELOAD:
            raise InvalidSpec(f"preload must be a list of at most {MAX_PRELOAD} module names")
        bad = [m for m in self.preload if not isinstance(m, str) or not MODULE_NAME.match(m)]
        if bad:
            raise InvalidSpec(f"preload must name modules (a.b.c), got {[str(m)[:80] for m in bad[:5]]}")

    def _check_hang_timeout(self) -> None:
        if type(self.hang_timeout_auto) is not bool:
            raise InvalidSpec("hang_timeout_auto must be true or false")
        seconds = self.hang_timeout_s
        if seconds is None:
            return
        if self.hang_timeout_auto:
            raise InvalidSpec("hang_timeout is either a number of seconds or auto, not both")
        if not MIN_HANG_TIMEOUT_S <= seconds <= MAX_HANG_TIMEOUT_S:
            raise InvalidSpec(
                f"hang_timeout must be {MIN_HANG_TIMEOUT_S:g}..{MAX_HANG_TIMEOUT_S:g} seconds or auto, "
                f"got {seconds}"
            )

    @property
    def hang_watch(self) -> bool:
        """Whether this job's ranks are watched for hangs (``--hang-timeout``)."""
        return self.hang_timeout_auto or self.hang_timeout_s is not None

    @property
    def argv(self) -> list[str]:
        """What each worker executes, as torchrun would build it."""
        match self.entry_kind:
            case EntryKind.SCRIPT:
                return [self.python, "-u", self.entry, *self.args]
            case EntryKind.MODULE:
                return [self.python, "-u", "-m", self.entry, *self.args]
            case EntryKind.EXEC:
                return [self.entry, *self.args]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["entry_kind"] = self.entry_kind.value
        out["stragglers"] = self.stragglers.value
        out["args"] = list(self.args)
        out["nnodes"] = str(self.nnodes)
        out["nodes"] = list(self.nodes)
        out["preload"] = list(self.preload)
        # Left out at their defaults: a daemon that does not know them reads such a spec still,
        # and rejects (as it must) only a job that asks for them.
        for name in ("numa_binding", "mig", "master_port"):
            if not out[name]:
                del out[name]
        if self.stragglers is StragglerPolicy.REPORT:
            del out["stragglers"]
        if not self.node_check:
            del out["node_check"]
        return out

    def allows(self, node: str) -> bool:
        return not self.nodes or node in self.nodes

    @classmethod
    def from_json(cls, data: Any) -> JobSpec:
        """The stored spec, checked as strictly as a submission. Unknown fields are refused, unlike
        other records': a spec field this daemon does not know (a limit, a constraint) must not
        be silently dropped while the job runs anyway."""
        try:
            return decode(cls, data, unknown=Unknown.REJECT)
        except DecodeError as exc:
            raise InvalidSpec(f"malformed job spec: {exc}") from None
