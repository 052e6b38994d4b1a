"""The composition root undoes exactly what it built, in reverse order, however far the start got."""

from __future__ import annotations

import ast
import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.config import Settings
from elasticd.daemon import compose
from elasticd.errors import ConfigError
from elasticd.netaddr import NoFreePort
from elasticd.node.hooks import LeaseHooks
from elasticd.node.liveness import LivenessServer
from elasticd.portfilter.guard import PortFilter

REPO = Path(__file__).resolve().parents[2]


class Trail:
    """Fakes for the parts built before the jobs; each says what was done to it, in order."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def part(self, name: str, *methods: str, **returns: Any) -> Any:
        def call(method: str) -> Any:
            def record(*_: Any, **__: Any) -> Any:
                self.done.append(f"{name}.{method}")
                return returns.get(method)

            return record

        return SimpleNamespace(**{m: call(m) for m in methods}, **returns.get("attrs", {}))


def fake_parts(monkeypatch: pytest.MonkeyPatch, trail: Trail) -> None:
    state = trail.part("state", "open", "close", "node_id", node_id="n1")
    monkeypatch.setattr(compose, "StateDir", lambda _: state)
    monkeypatch.setattr(compose, "detect", lambda instance: object())
    monkeypatch.setattr(compose, "detect_tracking", lambda instance: SimpleNamespace(base=None))
    monkeypatch.setattr(compose, "Reaper", lambda *_: trail.part("reaper", "start", "close"))
    embedded = trail.part("etcd", "start", "stop", attrs={"endpoint": "http://127.0.0.1:1"})
    monkeypatch.setattr(compose, "EmbeddedEtcd", lambda *_, **__: embedded)
    monkeypatch.setattr(compose, "connect", lambda *_, **__: trail.part("client", "health", "close"))
    monkeypatch.setattr(compose, "load_nvml", lambda: None)
    monkeypatch.setattr(compose, "discover", lambda *_: trail.done.append("discover"))


def start(tmp_path: Path) -> None:
    async def go() -> None:
        async with contextlib.AsyncExitStack() as stack:
            await compose.start(Settings(state_dir=tmp_path), stack, 0.0, lambda _: None)

    asyncio.run(go())


def test_a_part_that_fails_to_build_leaves_the_ones_before_it_undone_in_reverse_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trail = Trail()
    fake_parts(monkeypatch, trail)

    def no_port(*_: Any) -> None:
        raise NoFreePort("no free port in 29500-29501")

    monkeypatch.setattr(LivenessServer, "start", lambda self, ports: no_port())
    with pytest.raises(ConfigError, match="no free port"):
        start(tmp_path)
    built = ["state.open", "state.node_id", "reaper.start", "etcd.start", "client.health", "discover"]
    undone = ["client.close", "etcd.stop", "reaper.close", "state.close"]
    assert trail.done == built + undone


def test_a_start_that_fails_halfway_is_undone_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trail = Trail()
    fake_parts(monkeypatch, trail)

    def failing() -> None:
        trail.done.append("reaper.start")
        raise OSError("no sidecar")

    monkeypatch.setattr(
        compose,
        "Reaper",
        lambda *_: SimpleNamespace(start=failing, close=lambda: trail.done.append("reaper.close")),
    )
    with pytest.raises(OSError, match="no sidecar"):
        start(tmp_path)
    assert trail.done == ["state.open", "state.node_id", "reaper.start", "reaper.close", "state.close"]


def test_a_failure_in_the_jobs_part_undoes_the_lease_client_and_the_liveness_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trail = Trail()
    fake_parts(monkeypatch, trail)
    liveness = SimpleNamespace(port=1)

    async def listen(_: Any) -> None:
        trail.done.append("liveness.start")

    async def close() -> None:
        trail.done.append("liveness.close")

    liveness.start, liveness.close = listen, close
    monkeypatch.setattr(compose, "LivenessServer", lambda _: liveness)
    rt = SimpleNamespace(node_id="n1", address="127.0.0.1", reaper=None, ports=PortFilter.disabled("test"))
    monkeypatch.setattr(compose, "runtime", lambda *_: rt)

    class FullStore:
        def __init__(self, *_: Any) -> None:
            pass

        async def read(self) -> None:
            trail.done.append("space.read")
            raise OSError("etcd went away")

    monkeypatch.setattr(compose, "SpaceWatch", FullStore)
    with pytest.raises(OSError, match="etcd went away"):
        start(tmp_path)
    built = ["state.open", "state.node_id", "reaper.start", "etcd.start", "client.health", "discover"]
    built += ["liveness.start", "space.read"]
    undone = ["client.close", "liveness.close", "client.close", "etcd.stop", "reaper.close", "state.close"]
    assert trail.done == built + undone


class Listener:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def capacity(self) -> dict[str, Any]:
        return {"slots": 2}

    def fence_all(self) -> None:
        self.calls.append("fence_all")

    def wake(self) -> None:
        self.calls.append("wake")


def test_lease_hooks_reach_the_listener_attached_at_its_construction() -> None:
    hooks = LeaseHooks()
    hooks.lost()  # nobody to tell yet
    assert hooks.capacity() == {}
    listener = Listener()
    hooks.attach(listener)
    hooks.lost()
    hooks.granted()
    assert listener.calls == ["fence_all", "wake"] and hooks.capacity() == {"slots": 2}
    with pytest.raises(RuntimeError):
        hooks.attach(Listener())


def _wired_later(path: Path) -> list[str]:
    """Assignments that wire an object from outside it: a callback (``x.on_lost = ...``, or any
    lambda) or another object's private attribute (``x._registry = ...``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            callback = target.attr.startswith("on_") and not isinstance(node.value, ast.Call | ast.Constant)
            if callback or target.attr.startswith("_") or isinstance(node.value, ast.Lambda):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(target)}")
    return found


def test_nothing_is_wired_after_construction() -> None:
    """Every collaborator comes through a constructor (``daemon/compose.py`` builds them in order);
    none is patched in once the object exists."""
    files = [p for root in ("elasticd", "elasticctl") for p in sorted((REPO / root).rglob("*.py"))]
    assert len(files) > 100
    assert [f for p in files for f in _wired_later(p)] == []
