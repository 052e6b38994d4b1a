"""elasticd.etcd.client.parse_endpoint (and that the etcd client module imports in-process)."""

from __future__ import annotations

import os
import sys

import pytest

from elasticd.errors import ConfigError
from elasticd.etcd import client
from elasticd.etcd.client import EtcdClient, parse_endpoint


def test_module_imports_with_the_pure_python_protobuf() -> None:
    from google.protobuf.internal import api_implementation  # type: ignore[import-untyped]

    assert client.__name__ in sys.modules
    assert "etcd3" in sys.modules
    assert os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] == "python"
    assert api_implementation.Type() == "python"


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("127.0.0.1:2379", ("127.0.0.1", 2379)),
        ("localhost:2379", ("localhost", 2379)),
        ("http://h:1", ("h", 1)),
        ("https://h:2/", ("h", 2)),
        ("https://etcd.example.com:2379", ("etcd.example.com", 2379)),
        ("[::1]:2379", ("::1", 2379)),
        ("http://[fe80::1]:2380/", ("fe80::1", 2380)),
    ],
)
def test_parse_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


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
    ],
)
def test_parse_endpoint_rejects(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        parse_endpoint(endpoint)


@pytest.mark.parametrize("endpoint", ["h:0", "h:65536", "h:99999"])
def test_parse_endpoint_rejects_ports_out_of_range(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        parse_endpoint(endpoint)


def test_client_parses_every_endpoint_without_connecting() -> None:
    c = EtcdClient(["h1:1", "https://h2:2"])
    assert c.endpoints == [("h1", 1), ("h2", 2)]
    c.close()


@pytest.mark.parametrize("endpoints", [[], ["h1:1", "bad"]])
def test_client_rejects_bad_endpoint_lists(endpoints: list[str]) -> None:
    with pytest.raises(ConfigError):
        EtcdClient(endpoints)
