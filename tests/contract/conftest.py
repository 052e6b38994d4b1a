"""The contract tests' two backends: the same tests run against each."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.kv import KV
from elasticd.etcd.memory import MemoryKV
from tests.support import EtcdServer, unique

WAIT_S = 10.0


@pytest.fixture(params=["memory", "etcd"])
def kv(request: pytest.FixtureRequest) -> Iterator[KV]:
    if request.param == "memory":
        yield MemoryKV()
        return
    server: EtcdServer = request.getfixturevalue("etcd_server")
    before = set(threading.enumerate())
    client = EtcdClient([server.endpoint])
    yield client
    client.close()
    for thread in set(threading.enumerate()) - before:  # its watch thread ends within this test
        if thread.name.startswith("etcd3_watch"):
            thread.join(WAIT_S)


@pytest.fixture
def base(kv: KV) -> Iterator[str]:
    """A key prefix of this test's own; removed afterwards (the real etcd lives for the session)."""
    prefix = f"/contract/{unique('kv')}"
    yield prefix
    kv.delete_prefix(prefix + "/")
