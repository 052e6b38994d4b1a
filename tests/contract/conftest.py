"""The contract tests' two backends: the same tests run against each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.kv import KV
from elasticd.etcd.memory import MemoryKV
from tests.support import EtcdServer, gateway_post, unique, wait_for

WAIT_S = 10.0


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "etcd-watch"]


@pytest.fixture(params=["memory", "etcd"])
def kv(request: pytest.FixtureRequest) -> Iterator[KV]:
    if request.param == "memory":
        yield MemoryKV()
        return
    server: EtcdServer = request.getfixturevalue("etcd_server")
    client = EtcdClient([server.endpoint])
    yield client
    client.close()  # cancels the watches a test left open: their threads end at once
    assert watch_threads() == []


@pytest.fixture
def base(kv: KV) -> Iterator[str]:
    """A key prefix of this test's own; removed afterwards (the real etcd lives for the session)."""
    prefix = f"/contract/{unique('kv')}"
    yield prefix
    kv.delete_prefix(prefix + "/")


@pytest.fixture(params=["memory", "etcd"])
def breakable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[KV, Callable[[], None]]]:
    """A KV and a way to break its watches: ``break_watches`` in memory; for etcd, a private
    server (not the session's) that is stopped."""
    if request.param == "memory":
        memory = MemoryKV()
        yield memory, memory.break_watches
        return
    server = EtcdServer(tmp_path / "etcd", unique("breakable"))
    server.start()
    client = EtcdClient([server.endpoint], timeout_s=2)
    try:
        yield client, server.stop
    finally:
        client.close()
        server.stop()
    wait_for(lambda: watch_threads() == [], WAIT_S, 0.01, "watch threads to end")


Alarm = Callable[[str, bool], None]  # (alarm name, raise: True / disarm: False)


@pytest.fixture(params=["memory", "etcd"])
def alarmable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[KV, Alarm]]:
    """A KV and a way to raise or disarm one of its alarms: ``MemoryKV.alarms``; for etcd, a
    private server (the alarm is the whole cluster's) and ``/v3/maintenance/alarm``."""
    if request.param == "memory":
        memory = MemoryKV()

        def set_memory(name: str, on: bool) -> None:
            (memory.alarms.add if on else memory.alarms.discard)(name)

        yield memory, set_memory
        return
    server = EtcdServer(tmp_path / "etcd", unique("alarmed"))
    server.start()
    client = EtcdClient([server.endpoint], timeout_s=2)

    def set_etcd(name: str, on: bool) -> None:
        member = gateway_post(client, "/v3/maintenance/status", {})["header"]["member_id"]
        action = "ACTIVATE" if on else "DEACTIVATE"
        gateway_post(client, "/v3/maintenance/alarm", {"action": action, "memberID": member, "alarm": name})

    try:
        yield client, set_etcd
    finally:
        client.close()
        server.stop()
