"""A read of several ranges whose client gives up mid-read leaves etcd running.

etcd 3.5.0-3.5.4 (the embedded etcd is 3.5.1) exit on a read-only transaction cancelled while
a range in it is read (``elasticd.etcd.versions``). Both clients give up on slow reads (their
timeout closes the connection or cancels the call, which cancels the request in etcd): with
several large ranges read as one transaction, a member of those versions dies within a few such
reads. Here, on a private etcd of that version, reads time out again and again and etcd lives.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.backend import connect
from elasticd.etcd.kv import Backend
from elasticd.etcd.types import Put, Query
from elasticd.etcd.versions import splits_reads
from tests.support import EtcdServer

KEYS = 20_000  # each range then takes etcd a few hundred ms: a 50 ms timeout lands mid-read
VALUE = "x" * 200


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A private etcd (a crash must not take the session's with it) holding KEYS keys."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd-cancel"))
    server.start()
    client = connect("gateway", [server.endpoint])
    try:
        for start in range(0, KEYS, 100):  # etcd's default limit of operations per transaction
            client.txn([], [Put(f"big/{i:06d}", VALUE) for i in range(start, start + 100)])
    finally:
        client.close()
    yield server
    server.stop()


def backend(kind: str, endpoint: str, timeout_s: float) -> Backend:
    try:
        return connect(kind, [endpoint], timeout_s=timeout_s)
    except ConfigError as exc:  # the grpc extra missing
        pytest.skip(f"the {kind} backend cannot load: {exc}")


@pytest.mark.parametrize("kind", ["gateway", "grpc"])
def test_reads_that_time_out_mid_range_leave_etcd_running(loaded: EtcdServer, kind: str) -> None:
    whole = [Query("big/", prefix=True), Query("big/", prefix=True, serializable=True), Query("big/000007")]
    impatient = backend(kind, loaded.endpoint, timeout_s=0.05)
    patient = backend(kind, loaded.endpoint, timeout_s=30)
    try:
        assert splits_reads(patient.health())  # the embedded etcd's version: the crash is there
        for _ in range(8):
            with pytest.raises(EtcdUnavailable):
                impatient.read_many(whole)
            assert loaded.proc is not None and loaded.proc.poll() is None, "etcd exited"
        # What a daemon reads: the reads of several ranges that time out above are theirs, only larger.
        found = patient.read_many(
            [
                Query("big/", prefix=True, count_only=True),
                Query("big/", prefix=True, limit=3),
                Query("big/000007"),
            ]
        )
        assert [f.count for f in found] == [KEYS, KEYS, 1] and len(found[1].kvs) == 3
        assert len({f.revision for f in found}) == 1 and found[0].revision > 0  # one snapshot
        assert found[2].kvs[0].value == f'"{VALUE}"'.encode()
    finally:
        impatient.close()
        patient.close()
