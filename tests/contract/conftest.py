"""The contract tests' two backends: the same tests run against each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.kv import KV
from elasticd.etcd.memory import MemoryKV
from tests.support import EtcdServer, unique, wait_for

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
