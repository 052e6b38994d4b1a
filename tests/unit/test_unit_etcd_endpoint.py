"""elasticd.etcd.client.parse_endpoint, and which endpoints get TLS."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticd.errors import ConfigError
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.transport import Endpoint, parse_endpoint, uses_tls
from elasticd.etcd.types import EtcdAuth


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("127.0.0.1:2379", Endpoint("", "127.0.0.1", 2379)),
        ("localhost:2379", Endpoint("", "localhost", 2379)),
        ("http://h:1", Endpoint("http", "h", 1)),
        ("https://h:2/", Endpoint("https", "h", 2)),
        ("https://etcd.example.com:2379", Endpoint("https", "etcd.example.com", 2379)),
        ("[::1]:2379", Endpoint("", "::1", 2379)),
        ("http://[fe80::1]:2380/", Endpoint("http", "fe80::1", 2380)),
        ("unix:/run/e/localhost:2379", Endpoint("unix", "localhost", 0, "/run/e/localhost:2379")),
        ("unix:///run/e/sock", Endpoint("unix", "localhost", 0, "/run/e/sock")),
    ],
)
def test_parse_endpoint(endpoint: str, expected: Endpoint) -> None:
    assert parse_endpoint(endpoint) == expected
    assert parse_endpoint(str(expected)) == expected  # str() is a parseable form


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "h",
        "h:",
        ":2379",
        "h:port",
        "h:-1",
        "h:23 79",
        "http://h",
        "http://",
        "https://h:2/path",
        "[::1]",
        "ftp://h:1",
        "unix:relative/sock",
        "unix:",
    ],
)
def test_parse_endpoint_rejects(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        parse_endpoint(endpoint)


@pytest.mark.parametrize("endpoint", ["h:0", "h:65536", "h:99999"])
def test_parse_endpoint_rejects_ports_out_of_range(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        parse_endpoint(endpoint)


def test_tls_for_https_and_for_bare_endpoints_with_tls_files() -> None:
    files = EtcdAuth(ca=Path("/ca.pem"))
    assert uses_tls(parse_endpoint("https://h:1"), EtcdAuth())  # the system's CAs
    assert not uses_tls(parse_endpoint("h:1"), EtcdAuth())
    assert uses_tls(parse_endpoint("h:1"), files)  # as configurations before the gateway meant it
    assert not uses_tls(parse_endpoint("unix:/d/localhost:2379"), files)
    with pytest.raises(ConfigError, match="use https://"):
        uses_tls(parse_endpoint("http://h:1"), files)


def test_client_parses_every_endpoint_without_connecting() -> None:
    c = EtcdClient(["h1:1", "https://h2:2"])
    assert [(e.host, e.port) for e in c.endpoints] == [("h1", 1), ("h2", 2)]
    c.close()


@pytest.mark.parametrize("endpoints", [[], ["h1:1", "bad"]])
def test_client_rejects_bad_endpoint_lists(endpoints: list[str]) -> None:
    with pytest.raises(ConfigError):
        EtcdClient(endpoints)


def test_unusable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="etcd TLS files"):
        EtcdClient(["https://h:1"], EtcdAuth(ca=tmp_path / "missing.pem"))


def test_the_password_never_shows_in_a_repr() -> None:
    assert "s3cret" not in repr(EtcdAuth(user="u", password="s3cret"))
