"""The contract tests' two backends: the same tests run against each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elasticd.errors import ConfigError
from elasticd.etcd.backend import connect
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.kv import KV, Backend
from elasticd.etcd.memory import MemoryKV
from tests.support import EtcdServer, gateway_post, unique, wait_for

WAIT_S = 10.0
# In memory; a real etcd through its JSON gateway (EtcdClient); the same etcd over grpc.
BACKENDS = ["memory", "etcd", "grpc"]


def client(kind: str, endpoint: str, timeout_s: float = 5.0) -> Backend:
    """A real etcd's client of ``kind`` ("etcd": the gateway's); grpc is skipped without its extra."""
    try:
        return connect("grpc" if kind == "grpc" else "gateway", [endpoint], timeout_s=timeout_s)
    except ConfigError as exc:
        pytest.skip(f"the grpc backend cannot load (pip install 'elasticd[grpc]'): {exc}")


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "etcd-watch"]


@pytest.fixture(params=BACKENDS)
def kv(request: pytest.FixtureRequest) -> Iterator[KV]:
    if request.param == "memory":
        yield MemoryKV()
        return
    server: EtcdServer = request.getfixturevalue("etcd_server")
    real = client(request.param, server.endpoint)
    yield real
    real.close()  # cancels the watches a test left open: their threads end at once
    assert watch_threads() == []


@pytest.fixture
def base(kv: KV) -> Iterator[str]:
    """A key prefix of this test's own; removed afterwards (the real etcd lives for the session)."""
    prefix = f"/contract/{unique('kv')}"
    yield prefix
    kv.delete_prefix(prefix + "/")


@pytest.fixture(params=BACKENDS)
def breakable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[KV, Callable[[], None]]]:
    """A KV and a way to break its watches: ``break_watches`` in memory; for etcd, a private
    server (not the session's) that is stopped."""
    if request.param == "memory":
        memory = MemoryKV()
        yield memory, memory.break_watches
        return
    real = client(request.param, "127.0.0.1:1", timeout_s=2)  # skips before a server starts
    real.close()
    server = EtcdServer(tmp_path / "etcd", unique("breakable"))
    server.start()
    real = client(request.param, server.endpoint, timeout_s=2)
    try:
        yield real, server.stop
    finally:
        real.close()
        server.stop()
    wait_for(lambda: watch_threads() == [], WAIT_S, 0.01, "watch threads to end")


Alarm = Callable[[str, bool], None]  # (alarm name, raise: True / disarm: False)


@pytest.fixture(params=BACKENDS)
def alarmable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[KV, Alarm]]:
    """A KV and a way to raise or disarm one of its alarms: ``MemoryKV.alarms``; for etcd, a
    private server (the alarm is the whole cluster's) and ``/v3/maintenance/alarm``."""
    if request.param == "memory":
        memory = MemoryKV()

        def set_memory(name: str, on: bool) -> None:
            (memory.alarms.add if on else memory.alarms.discard)(name)

        yield memory, set_memory
        return
    client(request.param, "127.0.0.1:1").close()  # skips before a server starts
    server = EtcdServer(tmp_path / "etcd", unique("alarmed"))
    server.start()
    gateway = EtcdClient([server.endpoint], timeout_s=2)  # raises alarms as an operator would
    real = client(request.param, server.endpoint, timeout_s=2)

    def set_etcd(name: str, on: bool) -> None:
        member = gateway_post(gateway, "/v3/maintenance/status", {})["header"]["member_id"]
        action = "ACTIVATE" if on else "DEACTIVATE"
        gateway_post(gateway, "/v3/maintenance/alarm", {"action": action, "memberID": member, "alarm": name})

    try:
        yield real, set_etcd
    finally:
        real.close()
        gateway.close()
        server.stop()
