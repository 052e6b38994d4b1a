"""Fixtures: a session-wide real etcd, and a factory of real daemons cleaned up after each test."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from elasticd.workers.cgroups.hierarchy import detect
from tests.etcd_clients import ClientPolicy, policy
from tests.support import DaemonProc, EtcdServer, unique

os.environ.setdefault("OMP_NUM_THREADS", "1")
# As with an activated venv: `python` on PATH is the test interpreter, so jobs (which run the
# submitter's `python`) get torch and this checkout.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def pytest_configure(config: pytest.Config) -> None:
    try:
        policy()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> str:
    return policy().header()


PHASES = pytest.StashKey[dict[str, pytest.TestReport]]()
LOG_TAIL_LINES = 200  # of each daemon's log, printed when its test failed (its tasks' dump included)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so that a fixture's teardown knows the test failed."""
    report = yield
    item.stash.setdefault(PHASES, {})[report.when] = report
    return report


@pytest.fixture(scope="session")
def etcd_clients() -> ClientPolicy:
    """Which ``--etcd-client`` the daemons of a test get (tests/etcd_clients.py)."""
    return policy()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


DaemonFactory = Callable[..., DaemonProc]


@pytest.fixture
def daemon_factory(
    etcd_server: EtcdServer, tmp_path: Path, etcd_clients: ClientPolicy, request: pytest.FixtureRequest
) -> Iterator[DaemonFactory]:
    """Start daemons against the shared etcd, each under a key prefix of its own test.

    They say ``--address 127.0.0.1`` (every "host" of a test is this one), as a one-host cluster
    on an external etcd must; ``address=None`` leaves it unset, as a forgetful operator would.
    Each says ``--etcd-client`` as ``etcd_clients`` has it for the n-th daemon the test makes
    (mixed: the 1st on the gateway, the 2nd on grpc, ...), unless the test gives one; a daemon on
    the embedded etcd keeps the default, the gateway.

    Teardown stops every daemon, then fails the test if any process marked with one of its node
    ids is still alive (and kills it, so one leak cannot spill into the next test). When the test
    failed, the end of each daemon's log is printed: a CI run's temp dirs are gone by the time
    someone reads its output.
    """
    prefix = f"/t/{unique('p')}"
    started: list[DaemonProc] = []
    on_server: list[str] = []  # the daemons made on an external etcd, in order

    def make(
        node_id: str | None = None,
        *extra: str,
        embedded: bool = False,
        start: bool = True,
        env: dict[str, str] | None = None,
        address: str | None = "127.0.0.1",
    ) -> DaemonProc:
        node = node_id or unique("node")
        args = [*extra]
        if not embedded:
            if "--etcd-endpoints" not in args:
                args += ["--etcd-endpoints", etcd_server.endpoint]
            args += ["--etcd-prefix", prefix]
            if address is not None and "--address" not in args:
                args += ["--address", address]
            if "--etcd-client" not in args:
                args += ["--etcd-client", etcd_clients.client(len(on_server))]
            on_server.append(node)
        d = DaemonProc(node, tmp_path / node, args, dict(env if env is not None else os.environ))
        started.append(d)
        if start:
            d.start()
        return d

    yield make

    call = request.node.stash.get(PHASES, {}).get("call")
    if call is not None and call.failed:
        print_logs(started)
    leaks = []
    for d in started:
        d.stop()
        for proc in d.leftovers():
            leaks.append((d.node_id, proc.pid, " ".join(proc.cmdline())))
            proc.kill()
    for d in started:  # a daemon killed with SIGKILL could not remove its (empty) cgroup level
        detect(instance=d.node_id, move_self=False).release()
    assert not leaks, f"processes outlived their daemon: {leaks}"


def print_logs(daemons: list[DaemonProc]) -> None:
    """The end of each daemon's log, on the test's output; a daemon still running first writes
    what each of its tasks waits on (``SIGUSR1``: elasticd/daemon/taskdump.py)."""
    for d in daemons:
        d.dump_tasks()
        tail = d.log_text().splitlines()[-LOG_TAIL_LINES:]
        print(f"--- the last {len(tail)} lines of daemon {d.node_id}'s log ---", *tail, sep="\n")


@pytest.fixture
def daemon(daemon_factory: DaemonFactory) -> DaemonProc:
    return daemon_factory(None, "--slots", "4")
