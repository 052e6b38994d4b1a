"""``elasticctl check [NODE...]``: the pre-flight node check on demand, run across the cluster
through etcd, for an operator looking at a new or suspect host.

The asking daemon puts a request under each node's ``checks/<node>`` (under its own lease: a
request of a daemon that died goes with it). Each node's daemon hears its own in the watch
(``CheckResponder``), starts the check server (``workers/check_program.py``: its compute figure,
then peers' latency and bandwidth checks) as ``nobody`` for ``SERVE_S``, and answers under its lease
in ``checked/<node>``. The asking daemon waits for the answers (``ANSWER_S``), measures its link to
each other node's server as ``nobody`` (``jobs/nodecheck.probe``), deletes the requests and
answers, and judges every node against the others (``rendezvous.fitness.unfit``).

Every record is untrusted (decoded and bounded); a node that does not answer in time is reported
so, never waited for longer. No job's data is read; the processes run as ``nobody``, never root.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import re
import secrets
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from elasticd import log
from elasticd.decode import DecodeError, decode, parse_json
from elasticd.errors import EtcdUnavailable, NodeNotFound
from elasticd.etcd.keyref import Change, KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.jobs.launcher import CHECK_PYTHON
from elasticd.jobs.nodecheck import CheckFailed, CheckServer, Runner, probe
from elasticd.node.registry import NodeRegistry
from elasticd.rendezvous.fitness import Link, unfit
from elasticd.workers.proctree.spawn import Identity

_log = log.get("elasticd.check")

SERVE_S = 30.0  # a check server answers peers this long after a request
ANSWER_S = 10.0  # the asking daemon waits this long for every node's answer
POLL_S = 0.2
CHECK_KINDS = frozenset({KeyKind.CHECK_REQUEST, KeyKind.CHECK_ANSWER})
_ID = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class CheckRequest:
    """Value of ``checks/<node>``: serve a check, for request ``id``."""

    id: str
    by: str
    at: float

    def __post_init__(self) -> None:
        if not _ID.match(self.id) or len(self.by) > 64 or not math.isfinite(self.at):
            raise ValueError("a check request has an id of 16 hex digits, a user and a time")


@dataclass(frozen=True)
class CheckAnswer:
    """Value of ``checked/<node>``: the server of request ``id`` (``port``, ``compute``), or why not."""

    id: str
    address: str = ""
    port: int = 0
    compute: float | None = None
    error: str = ""

    def __post_init__(self) -> None:
        if not _ID.match(self.id) or len(self.address) > 256 or len(self.error) > 300:
            raise ValueError("a check answer has an id of 16 hex digits, an address and a short error")
        if not 0 <= self.port < 65536 or (self.compute is not None and not 0 <= self.compute < 1e15):
            raise ValueError("a check answer's port and compute are bounded")


def nobody() -> Identity | None:
    """Who an operator's check runs as: ``nobody``, never root (None: the daemon is no root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return Identity(65534, 65534, (65534,))
    return Identity(entry.pw_uid, entry.pw_gid, (entry.pw_gid,))


def runner() -> Runner:
    python = CHECK_PYTHON if os.path.exists(CHECK_PYTHON) else "python3"
    return Runner(python, nobody(), "/")


class CheckResponder:
    """Serves this node's checks when asked (``heard``: every check key's change)."""

    def __init__(self, kv: KV, keys: Keys, node: str, address: str, registry: NodeRegistry) -> None:
        self._kv, self._keys, self._node, self._address = kv, keys, node, address
        self._registry = registry
        self._task: asyncio.Task[None] | None = None

    def heard(self, change: Change) -> None:
        ref = change.ref
        if change.deleted or ref is None or ref.kind is not KeyKind.CHECK_REQUEST or ref.node != self._node:
            return
        if self._task is not None:
            self._task.cancel()  # a newer request: its server replaces the old one
        self._task = asyncio.create_task(self._serve(), name="node-check")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _serve(self) -> None:
        key = self._keys.check_request(self._node)
        try:
            kv = await asyncio.to_thread(self._kv.get, key)
            if kv is None:
                return
            request = decode(CheckRequest, parse_json(kv.value))
        except (DecodeError, ValueError, EtcdUnavailable) as exc:
            _log.warning("check.bad_request", why=str(exc)[:200])
            return
        try:
            server = await CheckServer.start(runner(), self._address, SERVE_S)
        except (OSError, CheckFailed) as exc:
            await self._answer(CheckAnswer(request.id, error=str(exc)[:300] or "it did not start"))
            return
        try:
            _log.info("check.serving", by=request.by, port=server.port, compute=round(server.compute))
            await self._answer(CheckAnswer(request.id, self._address, server.port, server.compute))
            await asyncio.sleep(SERVE_S)
        finally:
            await server.close()

    async def _answer(self, answer: CheckAnswer) -> None:
        lease = self._registry.lease_id
        with contextlib.suppress(EtcdUnavailable):
            key = self._keys.check_answer(self._node)
            await asyncio.to_thread(self._kv.put_json, key, asdict(answer), lease)


async def run_check(kv: KV, keys: Keys, registry: NodeRegistry, nodes: list[str], by: str) -> dict[str, Any]:
    """Ask ``nodes`` (every live node when empty) for a check, measure the links from here, and
    judge each node against the others: the ``check`` command's reply."""
    live = {r.node: r for r in await asyncio.to_thread(registry.records)}
    unknown = [n for n in nodes if n not in live]
    if unknown:
        raise NodeNotFound(f"no live node {', '.join(unknown[:5])}")
    targets = sorted(nodes or live)
    asked = secrets.token_hex(8)
    request = asdict(CheckRequest(asked, by[:64], time.time()))
    for node in targets:
        await asyncio.to_thread(kv.put_json, keys.check_request(node), request, registry.lease_id)
    try:
        answers = await _answers(kv, keys, targets, asked)
        me = registry.node_id
        servers = [(n, a.address, a.port) for n, a in answers.items() if n != me and a.port and not a.error]
        links = await probe(runner(), servers) if servers else {}
    finally:
        for node in targets:
            with contextlib.suppress(EtcdUnavailable):
                await asyncio.to_thread(kv.delete, keys.check_request(node))
                await asyncio.to_thread(kv.delete, keys.check_answer(node))
    return report(targets, answers, links, me)


async def _answers(kv: KV, keys: Keys, nodes: list[str], asked: str) -> dict[str, CheckAnswer]:
    """Each node's answer to request ``asked``, as they come, for at most ``ANSWER_S``: one read of
    every answer a poll, whatever the number of nodes."""
    found: dict[str, CheckAnswer] = {}
    deadline = time.monotonic() + ANSWER_S
    while len(found) < len(nodes) and time.monotonic() < deadline:
        answers = {a.key: a for a in await asyncio.to_thread(kv.get_prefix, keys.check_answers())}
        for node in nodes:
            got = answers.get(keys.check_answer(node))
            if node in found or got is None:
                continue
            try:
                answer = decode(CheckAnswer, parse_json(got.value))
            except (DecodeError, ValueError) as exc:
                found[node] = CheckAnswer(asked, error=f"its answer is invalid: {str(exc)[:200]}")
                continue
            if answer.id == asked:
                found[node] = answer
        await asyncio.sleep(POLL_S)
    return found


def report(
    nodes: list[str], answers: dict[str, CheckAnswer], links: dict[str, Link], me: str
) -> dict[str, Any]:
    """The reply: each node's figures, the cluster's medians, and a verdict for each (pure)."""
    compute = {n: a.compute for n, a in answers.items() if not a.error}
    verdicts = unfit(compute, links)
    rows = []
    for node in nodes:
        answer, link = answers.get(node), links.get(node, Link())
        error = "no answer in time" if answer is None else answer.error or link.error
        rows.append({
            "node": node, "compute": answer.compute if answer else None, "rtt_s": link.rtt_s,
            "bytes_per_s": link.bytes_per_s, "error": error,
            "verdict": error or verdicts.get(node, "ok"),
        })  # fmt: skip
    return {"nodes": rows, "cluster": _medians(rows), "measured_from": me}


def _medians(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in ("compute", "rtt_s", "bytes_per_s"):
        values = [r[name] for r in rows if r[name] is not None]
        out[name] = statistics.median(values) if values else None
    return out
