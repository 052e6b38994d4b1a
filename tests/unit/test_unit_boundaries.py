"""Boundaries a user relies on: the daemon never imports torch; where the socket lives."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from elasticd.control import address
from tests import importgraph


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


# What a job's start waits for: everything ``elasticctl submit`` (or ``elasticrun``) imports before
# its request leaves. Following the job, the other commands and the daemon's spec validation come after.
NOT_BEFORE_SUBMIT = (
    "elasticctl.follow",
    "elasticctl.life",
    "elasticctl.render",
    "elasticctl.views",
    "elasticctl.views.events",
    "elasticctl.views.status",
    "elasticctl.completion",
    "elasticctl.run",
    "elasticd.terms.spec",
    "elasticd.decode",
    "elasticd.log",
    "elasticd.workers.cgroups.limits",
    "datetime",
    "uuid",
)
SUBMIT = ["--nproc-per-node", "2", "train.py", "--", "--lr", "1"]
SUBMITS = {  # the module that runs, and its command line
    "elasticctl.cli": ["-m", "elasticctl", "submit", "--follow", *SUBMIT],
    "elasticctl.run": ["-c", "import sys; from elasticctl.run import main; sys.exit(main())", *SUBMIT],
}


@pytest.mark.parametrize("command", sorted(SUBMITS))
def test_submit_sends_its_request_before_importing_what_comes_after(command: str, tmp_path: Path) -> None:
    """The CLI runs under ``-X importtime`` against a socket that takes its request and never answers:
    what it imported by then is on stderr, and it waits for the answer, importing nothing more."""
    (tmp_path / "train.py").write_text("")
    sock = tmp_path / "ctl.sock"
    router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"ipc://{sock}")
    env = os.environ | {"ELASTICD_SOCKET": str(sock)}
    argv = [sys.executable, "-X", "importtime", *SUBMITS[command]]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    try:
        while not router.poll(100) and proc.poll() is None and time.monotonic() < deadline:
            pass
        raw = router.recv_multipart(zmq.NOBLOCK)[1] if router.poll(0) else b"{}"
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        router.close()
    assert json.loads(raw).get("cmd") == "submit", (
        f"no submit request (exit code {proc.returncode}): {err[-2000:]}"
    )
    loaded = {line.rpartition("|")[2].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert command in loaded  # the log is the CLI's
    assert sorted(loaded.intersection(NOT_BEFORE_SUBMIT) - {command}) == []


def test_completion_still_works_with_shtab_imported_late() -> None:
    from elasticctl import completion, parser

    text = completion.script(parser.build_parser(), "bash")
    assert "elasticctl" in text and "submit" in text


# Every module with no I/O: deciders, models, views, codecs, the job's terms. Each is imported
# alone, in a fresh interpreter, and must load none of ``IO``, directly or through what it imports.
PURE = (
    # deciders
    "elasticd.agent.step",
    "elasticd.agent.nextround",
    "elasticd.agent.blame",
    "elasticd.rendezvous.decider",
    "elasticd.portfilter.rules",
    "elasticd.rendezvous.reach",
    "elasticd.agent.stepbase",
    "elasticd.agent.supervision",
    "elasticd.agent.conduct",
    "elasticd.jobs.decider",
    "elasticd.manager.drainrule",
    "elasticd.manager.janitorrule",
    "elasticd.jobs.agentstore",
    "elasticd.jobs.admission",
    "elasticd.jobs.rootcause",
    "elasticd.progress.decider",
    "elasticd.progress.goodput",
    "elasticd.workers.warm.pool_decider",
    "elasticd.manager.access",
    "elasticd.manager.facts",
    "elasticd.manager.wakes",
    "elasticd.informer.store",
    "elasticd.informer.derived",
    "elasticd.node.allocator",
    "elasticd.gpu.devices",
    "elasticd.gpu.topology",
    "elasticd.gpu.health",
    "elasticd.gpu.placement",
    "elasticd.gpu.binding",
    "elasticd.etcd.space",
    "elasticd.history.rings",
    "elasticd.history.select",
    "elasticd.jobs.queue",
    "elasticd.jobs.room",
    "elasticd.jobs.quota",
    "elasticd.jobs.ticket",
    "elasticd.jobs.board",
    "elasticd.jobs.rate",
    "elasticd.jobs.logscope",
    "elasticd.jobs.snapshotspace",
    "elasticd.node.snapshotbound",
    "elasticd.integrations.rules",
    # records, models and views
    "elasticd.agent.record",
    "elasticd.agent.actions",
    "elasticd.rendezvous.model",
    "elasticd.rendezvous.fieldchecks",
    "elasticd.rendezvous.jobread",
    "elasticd.rendezvous.jobparse",
    "elasticd.rendezvous.glance",
    "elasticd.rendezvous.roster",
    "elasticd.happenings.records",
    "elasticd.history.model",
    "elasticd.history.schema",
    "elasticd.etcd.types",
    "elasticd.jobs.view",
    "elasticd.manager.statusviews",
    "elasticd.progress.tracker",
    "elasticd.progress.slowness",
    "elasticd.rendezvous.fitness",
    "elasticd.progress.timeouts",
    "elasticd.progress.protocol",
    "elasticd.progress.stacks",
    # the shared terms and the codecs
    "elasticd.terms.ids",
    "elasticd.terms.spec",
    "elasticd.terms.head",
    "elasticd.terms.state",
    "elasticd.terms.options",
    "elasticd.decode",
    "elasticd.errors",
    "elasticd.etcd.gateway",
    "elasticd.etcd.keys",
    "elasticd.etcd.keyref",
    "elasticd.etcd.eventkeys",
    "elasticd.control.envelope",
    "elasticd.control.params",
    "elasticd.metrics.address",
    "elasticd.wire",
    "elasticd.wire.args",
    "elasticd.wire.replies",
    "elasticd.wire.states",
    "elasticd.workers.warm.messages",
    "elasticd.workers.proctree.markers",
    "elasticd.workers.zygote_program.shared",
    "elasticd.workers.snapshot_program.protocol",
    # building a worker's world
    "elasticd.jobs.env",
    "elasticd.jobs.ranktext",
    "elasticctl.life",
    "elasticctl.runsignals",
    "elasticctl.render",
    "elasticctl.views.status",
    "elasticctl.views.events",
    "elasticctl.torchrun",
)
# The seams' protocols and their in-memory fakes: no I/O of their own, but run on the event loop.
SEAMS = (
    "elasticd.etcd.kv",
    "elasticd.etcd.memory",
    "elasticd.rendezvous.jobstore",
    "elasticd.rendezvous.storeread",
    "elasticd.rendezvous.store",
)
IO = (
    "elasticd.etcd.client",
    "elasticd.etcd.grpc.client",
    "elasticd.etcd.transport",
    "grpc",
    "http",
    "urllib.request",
    "asyncio",
    "socket",
    "subprocess",
    "zmq",
    "psutil",
    "torch",
)
HEAVY = ("elasticd.etcd.client", "http.client", "zmq", "psutil", "torch")


def loads(module: str, names: tuple[str, ...]) -> str:
    code = f"import sys, {module}; print(sorted(m for m in {names!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


# A module named for a decision, a model or a codec is pure, as is one whose docstring says so
# ("Pure: ...", "... Pure."): each must be in ``PURE``, so that a new one cannot be left out.
PURE_NAME = re.compile(
    r"^(decider|model|views?|env|allocator|records|roster|rules|protocol|types|schema|tracker|timeouts"
    r"|placement|health|topology|binding|wire|ids|spec|head)$|_decider$"
)
SAYS_PURE = re.compile(r"(^|[.:;]\s+)Pure\b")


def test_every_module_named_or_documented_as_pure_is_checked() -> None:
    found = {**importgraph.modules("elasticd"), **importgraph.modules("elasticctl")}
    named = {
        name
        for name, path in found.items()
        if path.name != "__init__.py"
        and (
            PURE_NAME.search(name.rpartition(".")[2])
            or SAYS_PURE.search(ast.get_docstring(ast.parse(path.read_text())) or "")
        )
    }
    assert {"elasticd.jobs.decider", "elasticd.rendezvous.roster", "elasticd.agent.blame"} <= named
    assert sorted(named - set(PURE)) == []


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    assert loads(module, IO) == "[]", f"{module} loads {loads(module, IO)}"


@pytest.mark.parametrize("module", SEAMS)
def test_seams_import_without_the_etcd_client_or_zmq(module: str) -> None:
    assert loads(module, HEAVY) == "[]", f"{module} loads {loads(module, HEAVY)}"


def test_socket_path_env_root_and_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICD_SOCKET", "/tmp/x.sock")
    assert address.default_socket_path() == Path("/tmp/x.sock")
    monkeypatch.delenv("ELASTICD_SOCKET")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert address.default_socket_path() == Path("/run/elasticd/control.sock")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert address.default_socket_path() == Path("/run/user/1000/elasticd/control.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert address.default_socket_path() == Path("/tmp/elasticd-1000/control.sock")
