"""Per-user limits and the fair queue, against a real daemon and etcd, as other users.

Jobs that must stay waiting name a node that does not exist (``nodes=["elsewhere"]``): no daemon
admits them, so they count against their user's limit and sit in the queue. Budget: about 15 s
for the module on 2 cores (three daemons; one job runs briefly).
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import NodeRange
from tests import fakes
from tests.conftest import DaemonFactory
from tests.support import DaemonProc, EtcdServer, unique, wait_for, wait_log
from tests.users import NOBODY, OTHER_USERS, SYSTEM_PYTHON, as_user, public_dir, public_workdir

pytestmark = OTHER_USERS
PLAIN = pwd.getpwnam("daemon")  # a user in no admin group (nobody is one: admin_group=nogroup)
LIMITS = {
    "ELASTICD_MAX_JOBS_PER_USER": "2",
    "ELASTICD_MAX_SUBMITS_PER_MINUTE": "4",
    "ELASTICD_MAX_SPEC_BYTES": "4096",
    "ELASTICD_ADMIN_GROUP": "nogroup",
    "ELASTICD_ADMIN_MAX_JOBS_PER_USER": "3",
    "ELASTICD_ADMIN_MAX_SUBMITS_PER_MINUTE": "0",
    "ELASTICD_SOCKET_MODE": "666",
}


@pytest.fixture
def public() -> Iterator[Path]:
    with public_dir("elasticd-quota-") as path:
        yield path


def _daemon(factory: DaemonFactory, root: Path, **env: str) -> DaemonProc:
    d = factory(None, start=False, env=dict(os.environ) | LIMITS | env)
    d.root = root / "daemon"
    d.stderr_path = d.root / "daemon.log"
    d.start()
    return d


def _script(public: Path) -> Path:
    script = public_workdir(public) / "sleep.py"
    script.write_text("import os, time\ntime.sleep(float(os.environ.get('SLEEP', '0')))\n")
    script.chmod(0o644)
    return script


def _args(script: Path, *, waiting: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "entry_kind": "script",
        "entry": str(script),
        "cwd": str(script.parent),
        "python": SYSTEM_PYTHON,
        "env": {"PATH": "/usr/bin:/bin", "SLEEP": "600"},
        "warm": False,
        "nodes": ["elsewhere"] if waiting else [],
    } | extra


def _as(uid: int, gid: int, d: DaemonProc, cmd: str, **args: Any) -> dict[str, Any]:
    return as_user(uid, gid, d.socket, cmd, **args)


def _refused(reply: dict[str, Any], code: str, *words: str) -> None:
    assert reply["ok"] is False and reply["code"] == code, reply
    for word in words:
        assert word in reply["message"], (word, reply["message"])


def test_a_user_over_each_limit_gets_its_code_and_admins_and_root_their_own(
    daemon_factory: DaemonFactory, public: Path
) -> None:
    d = _daemon(daemon_factory, public)
    script = _script(public)
    plain = (PLAIN.pw_uid, PLAIN.pw_gid)

    # Jobs held: two fit, the third names the count, the limit and the setting.
    for _ in range(2):
        assert _as(*plain, d, "submit", **_args(script))["ok"]
    _refused(
        _as(*plain, d, "submit", **_args(script)),
        "quota_exceeded",
        "daemon has 2 jobs pending or running",
        "the limit is 2",
        "max_jobs_per_user",
    )
    # The spec's size: the largest environment variables are named.
    big = _args(script, env={"PATH": "/usr/bin:/bin", "HUGE_BLOB": "x" * 6000})
    _refused(_as(*plain, d, "submit", **big), "too_large", "max_spec_bytes", "HUGE_BLOB (5.9 KiB)")
    # Four submits in this minute so far (refused ones count: each cost the daemon work).
    _refused(_as(*plain, d, "submit", **_args(script)), "quota_exceeded", "max_submits_per_minute")
    # --priority is for admins only (refused before it counts).
    _refused(_as(*plain, d, "submit", **_args(script, priority=3)), "permission_denied", "--priority")

    # An admin (nobody, through its primary group) has the admin limits, and may set a priority.
    for priority in (0, 0, 5):
        reply = _as(NOBODY, NOBODY, d, "submit", **_args(script, priority=priority))
        assert reply["ok"], reply
    _refused(
        _as(NOBODY, NOBODY, d, "submit", **_args(script)),
        "quota_exceeded",
        "the limit is 3",
        "admin_max_jobs_per_user",
    )

    # Root too; elasticctl prints the code and the message and exits 3.
    for _ in range(3):
        d.call("submit", **_args(script))
    res = d.ctl("submit", "--nodes", "elsewhere", "--no-python", "/bin/true")
    assert res.returncode == 3, res.stderr
    assert "error [quota_exceeded]: root has 3 jobs pending or running; the limit is 3" in res.stderr
    assert "(setting admin_max_jobs_per_user)" in res.stderr

    # Every waiting job has its place in the fair queue: the admin's priority 5 job first.
    jobs = [j for j in d.call("status")["jobs"] if j["state"] == "PENDING"]
    assert len(jobs) == 8
    places = sorted((j["queue"]["place"], j["user"]) for j in jobs)
    assert [p for p, _ in places] == list(range(1, 9)) and all(j["queue"]["of"] == 8 for j in jobs)
    first = next(j for j in jobs if j["queue"]["place"] == 1)
    assert first["user"] == "nobody" and first["queue"]["why"].startswith("priority 5")
    table = d.ctl("status").stdout
    assert "QUEUE" in table.splitlines()[0] and "1/8" in table
    assert d.answers()


def test_the_scan_considers_waiting_jobs_in_the_fair_queues_order(
    daemon_factory: DaemonFactory, public: Path
) -> None:
    """One slot; root queues three jobs behind its own running one, nobody then queues one: the
    next admission is nobody's job, ahead of root's older ones (users take turns)."""
    d = _daemon(daemon_factory, public, ELASTICD_SLOTS="1", ELASTICD_ADMIN_MAX_JOBS_PER_USER="0")
    script = _script(public)
    blocker = d.call("submit", **_args(script, waiting=False))["id"]
    d.wait_state(blocker, ("RUNNING",))
    root_jobs = [d.call("submit", **_args(script, waiting=False))["id"] for _ in range(3)]
    theirs = _as(NOBODY, NOBODY, d, "submit", **_args(script, waiting=False))
    assert theirs["ok"], theirs
    other = theirs["result"]["id"]
    # The node admitted root's job last: nobody's comes first, ahead of root's older ones.
    assert [d.job(j)["queue"]["place"] for j in (other, *root_jobs)] == [1, 2, 3, 4]
    d.call("kill", job=blocker)
    d.wait_state(other, ("RUNNING",), timeout_s=20)
    assert [d.job(j)["state"] for j in root_jobs] == ["PENDING"] * 3
    d.call("kill", job=other)  # and now it is root's turn again, oldest first
    d.wait_state(root_jobs[0], ("RUNNING",), timeout_s=20)
    assert [d.job(j)["queue"]["place"] for j in root_jobs[1:]] == [1, 2]
    d.call("kill", job=root_jobs[0])


def _spec(job_id: str, at: float, **kw: Any) -> Any:
    fields: dict[str, Any] = {
        "id": job_id,
        "uid": PLAIN.pw_uid,
        "gid": PLAIN.pw_gid,
        "user": PLAIN.pw_name,
        "nnodes": NodeRange(1, 1),
        "nproc_per_node": 1,
        "nodes": ("elsewhere",),
        "submitted_at": at,
        "env": {},
    }
    return fakes.make_spec(**(fields | kw))


def test_specs_written_straight_into_etcd_over_a_limit_fail_with_the_reason(
    daemon_factory: DaemonFactory, etcd_server: EtcdServer, public: Path
) -> None:
    d = _daemon(daemon_factory, public)
    kv = EtcdClient([etcd_server.endpoint], etcd_server.client_auth())
    keys = Keys(d.etcd_prefix)
    tag = unique("around")
    now = time.time()
    specs = [_spec(f"{tag}-{i}", now + i) for i in range(3)]
    specs.append(_spec(f"{tag}-big", now - 10, env={"BLOB": "y" * 8000}))
    try:
        for spec in specs:  # as the submit command's store would, but past its checks
            assert run_inline(InlineJobStore(kv, keys, spec.id).create(spec))
    finally:
        kv.close()
    big = d.wait_state(f"{tag}-big", ("FAILED",), timeout_s=20)
    assert big["code"] == "too_large" and "(setting max_spec_bytes)" in big["reason"], big
    over = d.wait_state(f"{tag}-2", ("FAILED",), timeout_s=20)
    assert over["code"] == "quota_exceeded", over
    assert "the limit is 2 (setting max_jobs_per_user)" in over["reason"], over
    # The oldest two fit (the one too large did not count), and the daemon goes on.
    assert [d.job(f"{tag}-{i}")["state"] for i in range(2)] == ["PENDING", "PENDING"]
    wait_log(d, "job.failed", job=f"{tag}-2", code="quota_exceeded")
    assert len([e for e in d.events("job.failed") if e.get("job") == f"{tag}-2"]) == 1  # once
    assert d.answers()
    wait_for(lambda: d.call("events", job=f"{tag}-2")["events"], 10, what="the failure in the history")
