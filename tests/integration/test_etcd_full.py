"""etcd near and at its quota, on a real etcd with a 32 MiB ``--quota-backend-bytes``: above the
high-water mark and under the NOSPACE alarm, new submits are refused with ``etcd_full``, the
running job keeps running and its node keeps its lease; after the operator's compaction,
defragmentation and ``etcdctl alarm disarm``, submits work again and no job was lost.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from elasticd.errors import EtcdNoSpace
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.embedded import find_etcd_binary
from elasticd.etcd.space import MIB
from tests.conftest import DaemonFactory
from tests.support import REPO, EtcdServer, alive_pid, put_raw, submit_job, wait_for, wait_round

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

MEMBER = REPO / "tests" / "scripts" / "member.py"  # runs until $OUT/finish exists
# The mark is 25.6 MiB. Not the 16 MiB etcd_quota_bytes allows: bbolt grows its file by a few MiB
# at once, which from just under a 12.8 MiB mark can pass a 16 MiB quota in one put.
QUOTA = 32 * MIB
TTL = 3.0
FILLER = "/filler/"  # outside the daemons' prefix: what another tenant of the etcd could write


class SmallEtcd(EtcdServer):
    def argv(self) -> list[str]:
        return [*super().argv(), "--quota-backend-bytes", str(QUOTA)]


def etcdctl(server: EtcdServer, *argv: str) -> None:
    binary = find_etcd_binary().parent / "etcdctl"
    cmd = [str(binary), "--endpoints", server.endpoint, "--dial-timeout", "3s", *argv]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def fill(client: EtcdClient, until: int | None) -> int:
    """Put 256 KiB values under FILLER until the database is above ``until`` bytes (None: until etcd
    refuses with NOSPACE); how many were put."""
    value = b"x" * (256 * 1024)
    for n in range(400):
        status = client.status()
        assert status is not None
        if until is not None and status.db_size > until:
            return n
        try:
            put_raw(client, f"{FILLER}{n:04d}", value)
        except EtcdNoSpace:
            return n
    raise AssertionError("etcd never filled up")


def space(d: Any) -> dict[str, Any]:
    return dict(d.call("nodes")["etcd"])


def test_etcd_at_its_quota_refuses_submits_and_loses_no_job(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    etcd = SmallEtcd(tmp_path / "etcd-small")
    etcd.start()
    client = EtcdClient([etcd.endpoint])
    try:
        d = daemon_factory(None, "--etcd-endpoints", etcd.endpoint, "--lease-ttl", str(TTL),
                           "--etcd-quota-bytes", str(QUOTA))  # fmt: skip
        out = tmp_path / "out"
        out.mkdir()
        job = submit_job(d, out, str(MEMBER))
        (worker,) = wait_round(out, 0, 1)
        assert space(d)["level"] == "ok"

        # Above the high-water mark: new jobs are refused, the running one goes on.
        fill(client, until=int(QUOTA * 0.8) + MIB // 2)
        wait_for(lambda: space(d)["level"] == "high", 15, 0.2, "the daemon to see etcd above its mark")
        refused = d.ctl("submit", str(MEMBER))
        assert refused.returncode == 3 and "etcd_high_water=0.8" in refused.stderr, refused.stderr
        assert "etcdctl defrag" in refused.stderr

        # At the quota: etcd raises NOSPACE and refuses every write that grows it.
        fill(client, until=None)
        wait_for(lambda: space(d)["level"] == "full", 15, 0.2, "the daemon to see the NOSPACE alarm")
        view = space(d)
        assert view["alarms"] == ["NOSPACE"] and view["quota_bytes"] == QUOTA
        alarmed_at = time.monotonic()
        refused = d.ctl("submit", str(MEMBER))
        assert refused.returncode == 3 and "NOSPACE" in refused.stderr, refused.stderr
        listed = json.loads(d.ctl("nodes", "--json").stdout)
        assert listed["etcd"]["level"] == "full" and [n["node"] for n in listed["nodes"]] == [d.node_id]
        assert "ALARM NOSPACE" in d.ctl("nodes").stdout
        # Past a lease TTL under the alarm: keep-alives still work, so the node's record (under
        # its lease) is still there, and the worker still runs.
        wait_for(lambda: time.monotonic() - alarmed_at > TTL + 1, 10, 0.2, "a lease TTL under the alarm")
        assert client.get(d.node_key()) is not None, "the node lost its lease under NOSPACE"
        assert alive_pid(worker["pid"]) and d.proc is not None and d.proc.poll() is None
        assert d.job(job)["state"] == "RUNNING"

        # The operator makes room: the filler goes, etcd is compacted and defragmented, disarmed.
        client.delete_prefix(FILLER)
        status = client.status()
        assert status is not None
        client.compact(status.revision)
        etcdctl(etcd, "defrag")
        etcdctl(etcd, "alarm", "disarm")
        wait_for(lambda: space(d)["level"] == "ok", 15, 0.2, "the daemon to see etcd back under its mark")

        (out / "finish").touch()
        final = d.wait_state(job, ("SUCCEEDED", "FAILED"), 30)
        assert (final["state"], final["restarts"]) == ("SUCCEEDED", 0), final
        again = submit_job(d, out, str(MEMBER))  # finish exists: it ends at once
        assert d.wait_state(again, ("SUCCEEDED", "FAILED"), 30)["state"] == "SUCCEEDED"
        assert d.proc.poll() is None and not d.events("lease.lost")
    finally:
        client.close()
        etcd.stop()
