"""``SIGUSR1``: a running daemon writes where each of its tasks waits, and goes on serving."""

from __future__ import annotations

from tests.conftest import DaemonFactory


def test_sigusr1_writes_every_tasks_stack_and_the_daemon_serves_on(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory(None, "--slots", "1")
    d.dump_tasks()
    assert [e["count"] for e in d.events("daemon.tasks")] and d.events("daemon.tasks")[0]["count"] >= 5
    tasks = {e["task"]: e["stack"] for e in d.events("daemon.task")}
    assert {"jobs", "watch", "registry", "control"} <= tasks.keys(), sorted(tasks)
    assert "JobManager.run()" in tasks["jobs"]  # where the scan's loop waits
    assert d.call("ping")
