"""Which etcd client the daemon builds (``etcd_client``), and what picking one costs the process:
the gateway path never loads grpc or protobuf, and the grpc backend leaves no protobuf setting in
the environment that the daemon's children would inherit."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from elasticd.config import load_settings
from elasticd.errors import ConfigError
from elasticd.etcd.backend import connect
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.gateway import Failure
from elasticd.etcd.grpc import proto

HAS_GRPC = importlib.util.find_spec("etcd3") is not None
PROBE = (
    "import json, os, sys\n"
    "from elasticd.etcd.backend import connect\n"
    "c = connect(sys.argv[1], ['127.0.0.1:1'])\n"
    "print(json.dumps({'type': type(c).__name__, 'grpc': 'grpc' in sys.modules,\n"
    "                  'protobuf': 'google.protobuf' in sys.modules,\n"
    "                  'env': os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION')}))\n"
)


def probe(kind: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != proto.PB_ENV}
    res = subprocess.run(
        [sys.executable, "-c", PROBE, kind], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def test_the_default_is_the_gateway_and_it_loads_no_grpc() -> None:
    assert load_settings(None, {}, {}).etcd_client == "gateway"
    assert probe("gateway") == {"type": "EtcdClient", "grpc": False, "protobuf": False, "env": None}
    client = connect("gateway", ["127.0.0.1:1"])
    assert isinstance(client, EtcdClient)
    client.close()


def test_an_unknown_client_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="etcd_client must be gateway or grpc"):
        load_settings(None, {"ELASTICD_ETCD_CLIENT": "etcdv2"}, {})


@pytest.mark.skipif(not HAS_GRPC, reason="the grpc extra is not installed (elasticd[grpc])")
def test_grpc_keeps_its_protobuf_setting_to_itself() -> None:
    assert probe("grpc") == {"type": "GrpcEtcdClient", "grpc": True, "protobuf": True, "env": None}


def test_without_the_extra_grpc_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def missing(name: str) -> object:
        if name.startswith("etcd3"):
            raise ImportError(f"No module named {name!r}")
        return real(name)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ConfigError, match=r"pip install 'elasticd\[grpc\]'"):
        connect("grpc", ["127.0.0.1:1"])
    assert proto.PB_ENV not in os.environ or os.environ[proto.PB_ENV] != "python"


class FakeRpcError(Exception):
    def __init__(self, code: int, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> object:
        return type("Code", (), {"value": (self._code, "")})()

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "failure"),
    [
        (14, "connection refused", Failure.UNREACHABLE),
        (4, "deadline exceeded", Failure.UNREACHABLE),
        (7, "etcdserver: permission denied", Failure.DENIED),
        (16, "etcdserver: invalid auth token", Failure.UNAUTHENTICATED),
        (8, "etcdserver: mvcc: database space exceeded", Failure.NO_SPACE),
        (3, "etcdserver: user name is empty", Failure.REFUSED),
    ],
)
def test_a_grpc_status_maps_as_the_gateways_code_does(code: int, details: str, failure: Failure) -> None:
    assert proto.status_of(FakeRpcError(code, details)).failure is failure


def test_an_error_without_a_status_is_unreachable() -> None:
    assert proto.status_of(RuntimeError("channel closed")).failure is Failure.UNREACHABLE
