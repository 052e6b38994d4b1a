"""torchrun's command line, understood: every flag torchrun 2.13 accepts, in both spellings.

Each flag is mapped to a submit argument, accepted with a one-line note saying why elasticd does
not need it, or refused with the reason. Like torchrun, each flag's default may come from the
environment (``PET_<DEST>``, e.g. ``PET_NPROC_PER_NODE``). ``elasticrun`` and ``elasticctl
submit`` both use this table; ``tests/unit/test_unit_torchrun_flags.py`` checks it against
torch's own parser, so a flag torch adds cannot be missed.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from elasticctl.entry import UsageError
from elasticd.terms.options import MODULE_NAME, NUMA_BINDINGS, StragglerPolicy


class Treat(StrEnum):
    MAPPED = "mapped"
    NOTED = "accepted"  # accepted with a note: elasticd does it another way
    REFUSED = "refused"


@dataclass(frozen=True)
class Flag:
    name: str  # the dash spelling; the underscore spelling is accepted too
    treat: Treat
    equivalent: str  # what elasticd does instead (the table in docs/guide/elasticrun.md shows it)
    dest: str = ""
    short: str = ""
    value: bool = True  # takes a value (else it is a switch)

    @property
    def key(self) -> str:
        return self.dest or self.name.lstrip("-").replace("-", "_")

    @property
    def spellings(self) -> list[str]:
        names = [self.short] if self.short else []
        names.append(self.name)
        underscore = self.name.replace("-", "_")
        return names + ([f"--{underscore[2:]}"] if underscore[2:] != self.name[2:] else [])


RDZV = "elasticd runs the rendezvous itself, through its etcd: no backend, endpoint or id to set"
FLAGS: tuple[Flag, ...] = (
    Flag("--nnodes", Treat.MAPPED, "`--nnodes N` or `MIN:MAX` (elastic)"),
    Flag("--nproc-per-node", Treat.MAPPED, "`--nproc-per-node N|gpu|cpu|auto`, as in torchrun"),
    Flag("--rdzv-backend", Treat.NOTED, RDZV),
    Flag("--rdzv-endpoint", Treat.NOTED, RDZV),
    Flag("--rdzv-id", Treat.MAPPED, "the job's id: every node that runs the same command joins one job"),
    Flag("--rdzv-conf", Treat.MAPPED, "`join_timeout` and `last_call_timeout` map to the round's timeouts"),
    Flag(
        "--standalone", Treat.NOTED, "every job has a rendezvous of its own: nothing to set up", value=False
    ),
    Flag(
        "--max-restarts", Treat.MAPPED, "`--max-restarts`, a budget for the whole job (default 0 as torchrun)"
    ),
    Flag(
        "--monitor-interval", Treat.NOTED, "the daemon learns of each exit at once: there is nothing to poll"
    ),
    Flag(
        "--start-method", Treat.NOTED, "workers are always fresh processes, as with torchrun's default spawn"
    ),
    Flag("--event-log-handler", Treat.NOTED, "events are in the daemon's structured log"),
    Flag("--role", Treat.NOTED, "a job has one role: every worker runs the same entry point"),
    Flag("--module", Treat.MAPPED, "`-m`: run a module, as `python -m`", short="-m", value=False),
    Flag("--no-python", Treat.MAPPED, "`--no-python`: run an executable", value=False),
    Flag(
        "--run-path",
        Treat.MAPPED,
        "the script runs as `python script.py`, as runpy.run_path does",
        value=False,
    ),
    Flag("--log-dir", Treat.NOTED, "the daemon keeps every rank's output per attempt: `elasticctl logs JOB`"),
    Flag(
        "--redirects",
        Treat.NOTED,
        "each rank's stdout and stderr go to its log, and --follow shows them",
        short="-r",
    ),
    Flag("--tee", Treat.NOTED, "output is both kept (`elasticctl logs`) and shown (--follow)", short="-t"),
    Flag("--local-ranks-filter", Treat.MAPPED, "only these local ranks' output is shown"),
    Flag("--duplicate-stdout-filters", Treat.NOTED, "there is no console file to duplicate into: use logs"),
    Flag("--duplicate-stderr-filters", Treat.NOTED, "there is no console file to duplicate into: use logs"),
    Flag("--node-rank", Treat.NOTED, "group ranks come from the rendezvous, and stay stable across restarts"),
    Flag(
        "--master-addr",
        Treat.NOTED,
        "MASTER_ADDR is group rank 0's node address, from the rendezvous"
        " (127.0.0.1 for a job of one node at most, whose store listens on loopback only)",
    ),
    Flag(
        "--master-port",
        Treat.MAPPED,
        "MASTER_PORT on every node: the ranks' store listens there on group rank 0's node, or the job "
        "fails at once saying why (without it: a port group rank 0's node picks, see worker_ports)",
    ),
    Flag("--local-addr", Treat.NOTED, "the node's address is the daemon's `address` setting"),
    Flag(
        "--logs-specs",
        Treat.REFUSED,
        "a LogsSpecs class would run inside the root daemon; logs are kept per "
        "rank by elasticd (`elasticctl logs`)",
    ),
    Flag(
        "--numa-binding",
        Treat.MAPPED,
        "`node`, `socket`, `exclusive`, `core-complex`: each rank's CPUs bound near its GPU, "
        "its memory preferring their NUMA node",
    ),
    Flag("--signals-to-handle", Treat.NOTED, "Ctrl-C, SIGTERM, SIGHUP and SIGQUIT stop the job"),
    Flag("--shutdown-timeout", Treat.MAPPED, "the job's stop grace: SIGTERM, then SIGKILL after it"),
    Flag(
        "--virtual-local-rank", Treat.REFUSED, "not supported: LOCAL_RANK is each worker's own", value=False
    ),
)
TORCHRUN_DEFAULTS: dict[str, Any] = {"nnodes": "1:1", "nproc_per_node": "1", "max_restarts": 0}
_CONF_KEYS = {"join_timeout": "join_timeout_s", "last_call_timeout": "last_call_s"}
_RANKS = re.compile(r"^\d+(,\d+)*$")


def add_flags(parser: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """Add every torchrun flag not in ``skip`` (keys of flags the caller defines itself)."""
    for flag in FLAGS:
        if flag.key in skip:
            continue
        default = os.environ.get(f"PET_{flag.key.upper()}", TORCHRUN_DEFAULTS.get(flag.key))
        if flag.value:
            parser.add_argument(*flag.spellings, dest=flag.key, default=default, help=argparse.SUPPRESS)
        else:
            parser.add_argument(
                *flag.spellings,
                dest=flag.key,
                action="store_true",
                default=bool(default),
                help=argparse.SUPPRESS,
            )


def _add_yield(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--yield",
        dest="yields",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="an elastic job (--nnodes MIN:MAX) lends nodes it holds above MIN to a waiting job of a "
        "higher priority, each by a graceful drain, and grows back once that job ends; --no-yield "
        "keeps every node it holds (default: yield)",
    )


def add_elasticd_flags(parser: argparse.ArgumentParser) -> None:
    """elasticd's own failure handling (torchrun has none of these), for both commands."""
    parser.add_argument(
        "--hang-timeout",
        "--hang_timeout",
        metavar="SECONDS|auto",
        default=None,
        help="a rank without progress this long counts as hung: its stacks are dumped and the job "
        "restarts; auto learns it from the job's step times (default: off)",
    )
    parser.add_argument(
        "--max-same-failures",
        "--max_same_failures",
        metavar="N",
        type=int,
        default=3,
        help="end the job when it fails the same way N times in a row with no progress, instead "
        "of spending the rest of its restarts; a failure from outside the job (a SIGKILL not the "
        "OOM killer's, a lost node) never counts (0: never; default: 3)",
    )
    parser.add_argument(
        "--node-check",
        "--node_check",
        dest="node_check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="before each round, check every node (compute, and its link to the round's leader) and "
        "leave out one far below its peers (default: the daemon's node_check setting)",
    )
    _add_yield(parser)
    parser.add_argument(
        "--stragglers",
        choices=[p.value for p in StragglerPolicy],
        default=StragglerPolicy.REPORT.value,
        help="what to do about a rank the others wait for: report it (status, metrics, events), or "
        "also drain its node out of the job once it stayed a straggler for the daemon's "
        "straggler_grace, if the job keeps its minimum size (default: report)",
    )
    parser.add_argument(
        "--no-warm",
        "--no_warm",
        dest="warm",
        action="store_false",
        help="exec every worker afresh instead of forking it from the job's warm zygote, which "
        "imports torch once per job and node (default: warm)",
    )
    parser.add_argument(
        "--preload",
        metavar="MOD[,MOD]",
        type=_modules,
        action="extend",
        default=[],
        help="modules the warm zygote imports besides torch, so workers start with them loaded",
    )


def _modules(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if not MODULE_NAME.match(m)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"not module names: {text!r}")
    return names


class FlagError(UsageError):
    """A flag that elasticd refuses, or a value it cannot use; the message says why."""


@dataclass(frozen=True)
class Mapped:
    """What the torchrun flags of a command line come to."""

    fields: dict[str, Any]  # SubmitArgs fields
    local_ranks: frozenset[int] | None  # --local-ranks-filter
    notes: list[str]


def interpret(ns: argparse.Namespace, gpus: Callable[[], int]) -> Mapped:
    """Read the torchrun flags of ``ns`` (``gpus``: how many GPUs this node has, asked lazily)."""
    fields: dict[str, Any] = {}
    notes = []
    for flag in FLAGS:
        value = getattr(ns, flag.key, None)
        given = value not in (None, False, "", TORCHRUN_DEFAULTS.get(flag.key)) and value != []
        if flag.treat is Treat.REFUSED and given:
            raise FlagError(f"{flag.name} is not supported: {flag.equivalent}")
        if flag.treat is Treat.NOTED and given and not _default_like(flag, value):
            notes.append(f"{flag.name}: not needed: {flag.equivalent}")
    if getattr(ns, "nproc_per_node", None) is not None:
        fields["nproc_per_node"] = nproc(str(ns.nproc_per_node), gpus)
    if getattr(ns, "rdzv_id", None) not in (None, "", "none"):
        fields["job_id"] = str(ns.rdzv_id)
    if getattr(ns, "rdzv_conf", None):
        fields |= rdzv_conf(str(ns.rdzv_conf))
    if getattr(ns, "shutdown_timeout", None) is not None:
        fields["stop_grace_s"] = _number("--shutdown-timeout", ns.shutdown_timeout)
    if getattr(ns, "numa_binding", None):
        fields["numa_binding"] = numa_binding(str(ns.numa_binding))
    if getattr(ns, "master_port", None) not in (None, ""):
        fields["master_port"] = master_port(str(ns.master_port))
    local_ranks = None
    if getattr(ns, "local_ranks_filter", None):
        text = str(ns.local_ranks_filter).replace(" ", "")
        if not _RANKS.match(text):
            raise FlagError(f"--local-ranks-filter takes local ranks like 0,2, got {text!r}")
        local_ranks = frozenset(int(r) for r in text.split(","))
    return Mapped(fields, local_ranks, notes)


def _default_like(flag: Flag, value: Any) -> bool:
    """Values that ask for what elasticd does anyway (no note needed)."""
    text = str(value).lower()
    return (flag.key == "start_method" and text == "spawn") or (
        flag.key == "rdzv_backend" and text == "static"
    )


def nproc(text: str, gpus: Callable[[], int]) -> int:
    """``--nproc-per-node``: a number, or ``gpu`` (this node's GPUs), ``cpu`` (its CPUs) or
    ``auto`` (GPUs if it has any, else CPUs), as torchrun reads it."""
    if text.isdigit():
        return int(text)  # the daemon checks the range, with every other field of the spec
    if text in ("gpu", "auto"):
        count = gpus()
        if count:
            return count
        if text == "gpu":
            raise FlagError("--nproc-per-node gpu: this node has no GPU")
    if text in ("cpu", "auto"):
        return os.cpu_count() or 1
    raise FlagError(f"--nproc-per-node takes a positive number, gpu, cpu or auto, got {text!r}")


def master_port(text: str) -> int:
    """``--master-port``: a port number (the daemon checks its range with the rest of the spec)."""
    if not text.strip().isdigit():
        raise FlagError(f"--master-port takes a port number, got {text!r}")
    return int(text)


def numa_binding(text: str) -> str:
    """``--numa-binding``: torchrun's values (``core_complex`` spelled either way)."""
    value = text.strip().lower().replace("_", "-")
    if value not in NUMA_BINDINGS:
        raise FlagError(f"--numa-binding takes one of {', '.join(NUMA_BINDINGS)}, got {text!r}")
    return value


def rdzv_conf(text: str) -> dict[str, float]:
    """``--rdzv-conf k=v,...``: the timeouts elasticd has; other keys are for other backends."""
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key.strip() in _CONF_KEYS:
            out[_CONF_KEYS[key.strip()]] = _number(f"--rdzv-conf {key.strip()}", value)
    return out


def _number(what: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise FlagError(f"{what} takes a number of seconds, got {value!r}") from None
    if number < 0:
        raise FlagError(f"{what} must not be negative")
    return number


def table() -> str:
    """The table of docs/guide/elasticrun.md: every torchrun flag and what elasticd does with it."""
    rows = ["| torchrun | elasticrun / elasticctl submit |", "|---|---|"]
    for flag in FLAGS:
        names = " ".join(f"`{n}`" for n in flag.spellings)
        rows.append(f"| {names} | {flag.treat.value}: {flag.equivalent} |")
    return "\n".join(rows)
