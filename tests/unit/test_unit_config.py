"""elasticd.config.load_settings: defaults, and file < ELASTICD_* environment < flags."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from elasticd import config
from elasticd.config import OPTIONS, Settings, env_of, flag_of, load_settings, setting_names
from elasticd.daemon.main import build_parser
from elasticd.errors import ConfigError
from elasticd.netaddr import PortRange


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No host config file, and no ambient variables that feed the defaults."""
    monkeypatch.setattr(config, "DEFAULT_CONFIG_FILE", tmp_path / "absent" / "elasticd.toml")
    for name in ("ELASTICD_SOCKET", "XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "elasticd.toml"
    path.write_text(text)
    return path


def test_options_cover_exactly_the_settings_fields() -> None:
    assert set(OPTIONS) == {f.name for f in dataclasses.fields(Settings)}
    assert setting_names() == list(OPTIONS)


# Three different valid values of every setting, as written in the file, the environment and a
# flag (None: a boolean flag without a value). A setting added without a row here fails below.
SAMPLES: dict[str, tuple[str, str, str | None]] = {
    "socket": ("/f/c.sock", "/e/c.sock", "/c/c.sock"),
    "socket_mode": ("600", "640", "0666"),
    "socket_group": ("g-file", "g-env", "g-flag"),
    "state_dir": ("/f/state", "/e/state", "/c/state"),
    "log_dir": ("/f/logs", "/e/logs", "/c/logs"),
    "node_id": ("n-file", "n-env", "n-flag"),
    "address": ("10.0.0.1", "10.0.0.2", "10.0.0.3"),
    "worker_ports": ("1000-1100", "2000-2100", "30000-30010"),
    "etcd_endpoints": ("f:2379", "e1:2379,e2:2379", "https://c:2379"),
    "etcd_prefix": ("/f", "/e", "/c"),
    "etcd_ca": ("/f/ca.pem", "/e/ca.pem", "/c/ca.pem"),
    "etcd_cert": ("/f/cert.pem", "/e/cert.pem", "/c/cert.pem"),
    "etcd_key": ("/f/key.pem", "/e/key.pem", "/c/key.pem"),
    "etcd_client": ("gateway", "grpc", "gateway"),
    "etcd_user": ("u-file", "u-env", "u-flag"),
    "etcd_password": ("p-file", "p-env", "p-flag"),
    "etcd_password_file": ("/f/pw", "/e/pw", "/c/pw"),
    "etcd_binary": ("/f/etcd", "/e/etcd", "/c/etcd"),
    "lease_ttl": ("4", "5.5", "7"),
    "gpu_poll": ("1.5", "2.5", "3.5"),
    "slots": ("1", "2", "3"),
    "stop_grace": ("0", "1.5", "30"),
    "straggler_grace": ("0", "2.5", "600"),
    "shrink_interval": ("0", "60", "900"),
    "node_check": ("false", "true", None),  # the flag: --no-node-check
    "job_retention": ("0", "60", "86400"),
    "allow_root_jobs": ("false", "true", None),  # the flag: --no-allow-root-jobs
    "port_filter": ("false", "true", None),  # the flag: --no-port-filter
    "warm_pool_size": ("0", "1", "8"),
    "warm_keep_s": ("0", "30", "600.5"),
    "snapshot_bytes": ("0", "1048576", "4294967296"),
    "log_group": ("lg-file", "lg-env", "lg-flag"),
    "max_jobs_per_user": ("0", "5", "100"),
    "max_submits_per_minute": ("0", "6", "60"),
    "max_spec_bytes": ("1024", "4096", "65536"),
    "admin_group": ("ag-file", "ag-env", "ag-flag"),
    "admin_max_jobs_per_user": ("0", "50", "1000"),
    "admin_max_submits_per_minute": ("0", "70", "600"),
    "etcd_quota_bytes": ("16777216", "33554432", "2147483648"),
    "etcd_high_water": ("0.5", "0.75", "0.9"),
    "metrics_address": ("9464", ":9465", "0.0.0.0:9466"),
    "log_format": ("json", "console", "auto"),
    "log_level": ("debug", "warning", "error"),
}


def _argv(name: str, value: str | None) -> list[str]:
    return [f"--no-{flag_of(name)[2:]}"] if value is None else [flag_of(name), value]


@pytest.mark.parametrize("name", setting_names())
def test_every_setting_is_a_flag_of_elasticd_and_flags_win(name: str, tmp_path: Path) -> None:
    """docs/guide/configuration.md: every setting is a TOML key, an ELASTICD_ variable and a flag;
    file < env < flags."""
    assert name in SAMPLES, f"add sample values of the new setting {name!r} to SAMPLES"
    file_value, env_value, flag_value = SAMPLES[name]
    path = toml(tmp_path, f"{name} = {json.dumps(file_value)}\n")
    env = {env_of(name): env_value}
    flags = vars(build_parser().parse_args(["--config", str(path), *_argv(name, flag_value)]))
    config_file = flags.pop("config")
    assert [k for k, v in flags.items() if v is not None] == [name]  # the flag sets exactly its setting

    def value(file: Path | None, environ: dict[str, str], given: dict[str, Any]) -> Any:
        return getattr(load_settings(file, environ, given), name)

    convert = OPTIONS[name].convert
    expected_flag = False if flag_value is None else convert(flag_value)
    assert value(config_file, env, flags) == expected_flag
    assert value(config_file, env, {}) == convert(env_value) != expected_flag
    assert value(config_file, {}, {}) == convert(file_value) != convert(env_value)


def test_every_setting_is_in_the_configuration_guide() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "configuration.md").read_text()
    assert [name for name in setting_names() if f"`{name}`" not in guide] == []


def test_snapshot_bytes_unset_is_derived_and_zero_turns_snapshots_off() -> None:
    assert load_settings(None, {}, {}).snapshot_bytes is None  # node/snapshotbound.py derives it
    assert load_settings(None, {"ELASTICD_SNAPSHOT_BYTES": ""}, {}).snapshot_bytes is None
    assert load_settings(None, {"ELASTICD_SNAPSHOT_BYTES": "0"}, {}).snapshot_bytes == 0


def test_worker_ports() -> None:
    assert load_settings(None, {}, {}).worker_ports is None
    assert load_settings(None, {}, {"worker_ports": "29500-29999"}).worker_ports == PortRange(29500, 29999)
    assert load_settings(None, {"ELASTICD_WORKER_PORTS": " 29500 "}, {}).worker_ports == PortRange(
        29500, 29500
    )
    assert load_settings(None, {"ELASTICD_WORKER_PORTS": ""}, {}).worker_ports is None


@pytest.mark.parametrize("value", ["29999-29500", "0-10", "65535-65536", "a-b", "29500-", "-5", "1-2-3"])
def test_bad_worker_ports(value: str) -> None:
    with pytest.raises(ConfigError, match="worker_ports"):
        load_settings(None, {}, {"worker_ports": value})


@pytest.mark.parametrize(
    ("endpoints", "address", "single_host_only", "warned"),
    [
        ("", None, False, False),  # embedded etcd: one host by construction
        ("", "127.0.0.1", False, False),
        ("etcd:2379", None, True, True),  # the forgotten address: no multi-node job here
        ("etcd:2379", "127.0.0.1", False, True),  # explicit: every node runs on this host
        ("etcd:2379", "localhost", False, True),
        ("etcd:2379", "::1", False, True),
        ("etcd:2379", "10.0.1.17", False, False),
        ("etcd:2379", "gpu-17.example", False, False),
    ],
)
def test_loopback_address_with_external_etcd(
    endpoints: str, address: str | None, single_host_only: bool, warned: bool
) -> None:
    s = load_settings(None, {}, {"etcd_endpoints": endpoints, "address": address})
    assert s.effective_address == (address or "127.0.0.1")
    assert (s.single_host_only, s.loopback_with_external_etcd) == (single_host_only, warned)


def test_defaults() -> None:
    s = load_settings(None, {}, {})
    assert s.socket_mode == 0o660
    assert s.socket_group == "elastic"
    assert s.etcd_endpoints == ()
    assert s.embedded_etcd
    assert s.etcd_prefix == "/elasticd/v6"
    assert s.lease_ttl == 10.0
    assert s.stop_grace == 10.0
    assert (s.log_format, s.log_level) == ("auto", "info")
    assert (s.warm_pool_size, s.warm_keep_s) == (2, 120.0)
    none_by_default = (
        "log_dir", "node_id", "address", "etcd_ca", "etcd_cert", "etcd_key",
        "etcd_user", "etcd_password", "etcd_password_file", "etcd_binary", "slots",
    )  # fmt: skip
    assert all(getattr(s, name) is None for name in none_by_default)


def test_default_paths_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    s = load_settings(None, {}, {})
    assert s.socket == Path("/run/elasticd/control.sock")
    assert s.state_dir == Path("/var/lib/elasticd")
    assert s.effective_log_dir == Path("/var/log/elasticd")


def test_default_paths_as_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    s = load_settings(None, {}, {})
    assert s.socket == tmp_path / "run" / "elasticd" / "control.sock"
    assert s.state_dir == tmp_path / "state" / "elasticd"
    assert s.effective_log_dir == tmp_path / "state" / "elasticd" / "logs"


def test_explicit_log_dir_wins() -> None:
    assert load_settings(None, {}, {"log_dir": "/x/logs"}).effective_log_dir == Path("/x/logs")


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = toml(tmp_path, 'lease_ttl = 5\netcd_prefix = "/from/file"\nnode_id = "file-node"\nslots = 2\n')
    env = {"ELASTICD_LEASE_TTL": "6", "ELASTICD_ETCD_PREFIX": "/from/env"}
    flags: dict[str, Any] = {"lease_ttl": "7", "etcd_prefix": None, "node_id": None, "slots": None}

    s = load_settings(path, env, flags)
    assert s.lease_ttl == 7.0  # flag beats env and file
    assert s.etcd_prefix == "/from/env"  # env beats file; a None flag was not given
    assert s.node_id == "file-node"  # file only
    assert s.slots == 2

    s = load_settings(path, env, {})
    assert s.lease_ttl == 6.0

    s = load_settings(path, {}, {})
    assert (s.lease_ttl, s.etcd_prefix) == (5.0, "/from/file")


def test_default_config_file_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = toml(tmp_path, 'node_id = "n-default"\n')
    monkeypatch.setattr(config, "DEFAULT_CONFIG_FILE", path)
    assert load_settings(None, {}, {}).node_id == "n-default"


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml", {}, {})


def test_config_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_settings(tmp_path, {}, {})


def test_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_settings(toml(tmp_path, "lease_ttl = = 5\n"), {}, {})


def test_unknown_key_in_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lease_tll"):
        load_settings(toml(tmp_path, "lease_tll = 5\n"), {}, {})


def test_unknown_flag() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        load_settings(None, {}, {"bogus": "1"})


def test_unrelated_and_unknown_environment_is_ignored() -> None:
    env = {"ELASTICD_NOT_A_SETTING": "x", "LEASE_TTL": "1", "PATH": "/bin", "ELASTICD_LEASE_TTL": "3"}
    assert load_settings(None, env, {}).lease_ttl == 3.0


def test_dashed_keys_in_toml(tmp_path: Path) -> None:
    s = load_settings(toml(tmp_path, 'lease-ttl = 4\netcd-prefix = "/p"\n'), {}, {})
    assert (s.lease_ttl, s.etcd_prefix) == (4.0, "/p")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:2379", ("127.0.0.1:2379",)),
        ("a:1,b:2", ("a:1", "b:2")),
        (" a:1 , b:2 ,", ("a:1", "b:2")),
        ("", ()),
        (",", ()),
    ],
)
def test_etcd_endpoints_from_comma_string(value: str, expected: tuple[str, ...]) -> None:
    assert load_settings(None, {"ELASTICD_ETCD_ENDPOINTS": value}, {}).etcd_endpoints == expected
    assert load_settings(None, {}, {"etcd_endpoints": value}).etcd_endpoints == expected


def test_etcd_endpoints_from_toml_list(tmp_path: Path) -> None:
    s = load_settings(toml(tmp_path, 'etcd_endpoints = ["h1:2379", " h2:2379 ", ""]\n'), {}, {})
    assert s.etcd_endpoints == ("h1:2379", "h2:2379")
    assert not s.embedded_etcd


def test_etcd_endpoints_from_toml_string(tmp_path: Path) -> None:
    s = load_settings(toml(tmp_path, 'etcd_endpoints = "h1:2379,h2:2379"\n'), {}, {})
    assert s.etcd_endpoints == ("h1:2379", "h2:2379")


@pytest.mark.parametrize(("value", "mode"), [("0640", 0o640), ("640", 0o640), ("0o600", 0o600), ("0", 0)])
def test_socket_mode_octal_string(value: str, mode: int) -> None:
    assert load_settings(None, {"ELASTICD_SOCKET_MODE": value}, {}).socket_mode == mode


def test_socket_mode_toml_integer(tmp_path: Path) -> None:
    assert load_settings(toml(tmp_path, "socket_mode = 0o600\n"), {}, {}).socket_mode == 0o600


def test_paths_and_optionals_are_converted(tmp_path: Path) -> None:
    env = {
        "ELASTICD_STATE_DIR": "/s",
        "ELASTICD_ETCD_CA": "/ca.pem",
        "ELASTICD_SNAPSHOT_BYTES": "2",
        "ELASTICD_SLOTS": "",  # empty optional means unset
        "ELASTICD_SOCKET": "/r/c.sock",
    }
    s = load_settings(None, env, {})
    assert s.state_dir == Path("/s")
    assert s.etcd_ca == Path("/ca.pem")
    assert s.socket == Path("/r/c.sock")
    assert s.snapshot_bytes == 2
    assert s.slots is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lease_ttl", "abc"),
        ("lease_ttl", "1"),
        ("lease_ttl", "1.99"),
        ("lease_ttl", "-5"),
        ("stop_grace", "-1"),
        ("stop_grace", "soon"),
        ("slots", "0"),
        ("slots", "two"),
        ("slots", "1.5"),
        ("socket_mode", "rw-r--r--"),
        ("socket_mode", "0999"),
        ("log_format", "xml"),
        ("warm_pool_size", "-1"),
        ("warm_pool_size", "1.5"),
        ("warm_pool_size", "65"),
        ("warm_keep_s", "-1"),
        ("warm_keep_s", "nan"),
        ("warm_keep_s", "inf"),
        ("warm_keep_s", "a while"),
        ("snapshot_bytes", "-1"),
        ("snapshot_bytes", "1.5"),
        ("snapshot_bytes", str(1 << 45)),
    ],
)
def test_bad_values(key: str, value: str) -> None:
    with pytest.raises(ConfigError):
        load_settings(None, {f"ELASTICD_{key.upper()}": value}, {})
    with pytest.raises(ConfigError):
        load_settings(None, {}, {key: value})


@pytest.mark.parametrize("line", ["lease_ttl = [1]", "socket = 5", 'lease_ttl = "x"', "lease_ttl = 1.0"])
def test_bad_values_in_toml(tmp_path: Path, line: str) -> None:
    with pytest.raises(ConfigError):
        load_settings(toml(tmp_path, line + "\n"), {}, {})


def test_error_names_the_source_and_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"environment.*lease_ttl"):
        load_settings(None, {"ELASTICD_LEASE_TTL": "abc"}, {})
    path = toml(tmp_path, 'slots = "many"\n')
    with pytest.raises(ConfigError, match="slots") as info:
        load_settings(path, {}, {})
    assert str(path) in str(info.value)


def test_settings_direct_validation() -> None:
    with pytest.raises(ConfigError):
        Settings(lease_ttl=1.5)
    assert Settings(lease_ttl=2).lease_ttl == 2


@pytest.mark.parametrize(("key", "value"), [("log_level", "verbose"), ("lease_ttl", "nan")])
def test_invalid_values_not_caught(key: str, value: str) -> None:
    with pytest.raises(ConfigError):
        load_settings(None, {f"ELASTICD_{key.upper()}": value}, {})


@pytest.mark.parametrize(("raw", "mode"), [(0o660, 0o660), (660, 0o660), ("660", 0o660), ("0666", 0o666)])
def test_socket_mode_is_octal_however_written(raw: object, mode: int) -> None:
    assert load_settings(None, {}, {"socket_mode": raw}).socket_mode == mode


def test_every_example_setting_is_valid(tmp_path: Path) -> None:
    """Each commented-out ``#key = value`` of packaging/elasticd.toml.example loads as it is."""
    example = Path(__file__).resolve().parents[2] / "packaging" / "elasticd.toml.example"
    lines = [line[1:] for line in example.read_text().splitlines() if re.match(r"#[a-z_]+ = ", line)]
    assert any(line.startswith("worker_ports") for line in lines)
    for line in lines:
        load_settings(toml(tmp_path, line + "\n"), {}, {})


def test_one_etcd_password_source_and_never_in_a_repr() -> None:
    with pytest.raises(ConfigError, match="not both"):
        load_settings(None, {"ELASTICD_ETCD_PASSWORD": "s3cret"}, {"etcd_password_file": "/etc/pw"})
    s = load_settings(None, {"ELASTICD_ETCD_PASSWORD": "s3cret"}, {"etcd_user": "node"})
    assert s.etcd_password == "s3cret" and "s3cret" not in repr(s)
