"""Boundaries a user relies on: the daemon never imports torch; where the socket lives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticd.control import address


def test_daemon_and_cli_do_not_import_torch() -> None:
    code = (
        "import sys, elasticd.daemon.app, elasticd.daemon.main, elasticctl.cli; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


# What every elasticctl call would load for nothing: the daemon's logging (structlog, and the
# asyncio it imports), shell completion (shtab: only ``elasticctl completion``), the etcd client, psutil.
CLI_NEVER = ("structlog", "asyncio", "shtab", "psutil", "elasticd.etcd.client", "torch")


@pytest.mark.parametrize("module", ["elasticctl.cli", "elasticctl.run"])
def test_the_cli_starts_without_the_daemons_libraries(module: str) -> None:
    """``elasticctl submit`` is on the path of every job's start: its imports are start-up time."""
    code = f"import sys, {module}; print(sorted(m for m in {CLI_NEVER!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", f"{module} loads {out.stdout.strip()}"


def test_completion_still_works_with_shtab_imported_late() -> None:
    from elasticctl import cli, completion

    text = completion.script(cli.build_parser(), "bash")
    assert "elasticctl" in text and "submit" in text


PURE = (
    "elasticd.agent.step",
    "elasticd.agent.record",
    "elasticd.agent.actions",
    "elasticd.rendezvous.snapshot",
    "elasticd.rendezvous.decider",
    "elasticd.rendezvous.model",
    "elasticd.rendezvous.store",
    "elasticd.etcd.gateway",
    "elasticd.etcd.keys",
    "elasticd.etcd.kv",
    "elasticd.etcd.memory",
    "elasticd.etcd.types",
    "elasticd.jobs.admission",
    "elasticd.jobs.view",
    "elasticd.jobs.decider",
    "elasticd.jobs.rootcause",
    "elasticd.jobs.logscope",
    "elasticd.jobs.ranktext",
    "elasticd.jobs.state",
    "elasticd.wire",
    "elasticd.workers.pool_decider",
)
HEAVY = ("elasticd.etcd.client", "http.client", "zmq", "psutil", "torch")


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_without_the_etcd_client_or_zmq(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", f"{module} loads {out.stdout.strip()}"


def test_socket_path_env_root_and_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICD_SOCKET", "/tmp/x.sock")
    assert address.default_socket_path() == Path("/tmp/x.sock")
    monkeypatch.delenv("ELASTICD_SOCKET")
    monkeypatch.setattr(address.os, "geteuid", lambda: 0)
    assert address.default_socket_path() == Path("/run/elasticd/control.sock")
    monkeypatch.setattr(address.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert address.default_socket_path() == Path("/run/user/1000/elasticd/control.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert address.default_socket_path() == Path("/tmp/elasticd-1000/control.sock")
