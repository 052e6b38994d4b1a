"""What a submit, the scan its change wakes and the ``status`` calls after it cost with many jobs
queued: the same work for 20 jobs as for 200 (counted, not timed). Each count here grew with the
queue when ``status`` and the scan worked from the whole read at every call: a ticket and a view
per job, a JSON encoding per job, the queue ordered per call, every key read again. The counts
are of the pure functions that make each part, called through the copy (``ClusterCopy.derive``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.etcd.types import Found, KeyValue, Query
from elasticd.informer.informer import Phase
from elasticd.jobs import board
from elasticd.manager import clustercopy, statusviews
from elasticd.manager.facts import NodeFacts
from elasticd.manager.service import CommandService
from elasticd.rendezvous.store import InlineJobStore, run_inline
from elasticd.terms.spec import NodeRange
from tests.fakes import bare_manager, make_spec

KEYS = Keys("/t")


class CountingKV(MemoryKV):
    """``MemoryKV`` that counts read requests and the keys they return."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0
        self.keys_read = 0

    def get(self, key: str) -> KeyValue | None:
        self.requests += 1
        found = super().get(key)
        self.keys_read += found is not None
        return found

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        self.requests += 1
        found = super().read_many(queries)
        self.keys_read += sum(len(f.kvs) for f in found)
        return found


@dataclass(frozen=True)
class Costs:
    tickets: int  # tickets made
    queues: int  # queue orders computed
    encoded: int  # views encoded
    assembled: int  # replies of ``status`` (every job) assembled
    requests: int  # etcd read requests
    keys_read: int  # keys those returned
    reads: int  # lists of every job (``Informer``)
    passes: int  # requests that cost etcd a pass over every job's keys (lists and probes)


def counted(monkeypatch: pytest.MonkeyPatch, made: Counter[str], module: ModuleType, name: str) -> None:
    """``module.name`` counting its calls into ``made[name]``."""
    fn: Callable[..., Any] = getattr(module, name)

    def counting(*args: Any) -> Any:
        made[name] += 1
        return fn(*args)

    monkeypatch.setattr(module, name, counting)


def one_change(n: int, tmp: Path, made: Counter[str]) -> tuple[Costs, list[bytes]]:
    """With ``n`` jobs queued (4 users, none for this node) and everything read once: the costs of
    one submit, the scan its watch event wakes, and three ``status`` of every job (``made``: what
    each counted function made so far)."""
    kv = CountingKV()
    for i in range(n):
        user = i % 4
        spec = make_spec(id=f"q{i:04d}", uid=3000 + user, gid=3000 + user, user=f"u{user}",
                         nodes=("elsewhere",), submitted_at=1.7e9 + i)  # fmt: skip
        assert run_inline(InlineJobStore(kv, KEYS, spec.id).create(spec))
    m = bare_manager(kv, KEYS, tmp, lease=kv.grant_lease(3600))
    registry = SimpleNamespace(records=lambda: [])
    facts = NodeFacts("n1", 0.0, (), True, True, 10.0, tmp)
    service = CommandService(facts, m, registry, kv, KEYS)  # type: ignore[arg-type]

    def counts() -> Costs:
        informer = m.cluster.informer
        return Costs(made["ticket_of"], made["queue"], made["held"], made["reply"],
                     kv.requests, kv.keys_read, informer.lists, informer.lists + informer.probes)  # fmt: skip

    async def run() -> tuple[Costs, Costs, list[bytes]]:
        watch = asyncio.ensure_future(m.cluster.run())  # it tells the submit of its new job's head
        deadline = time.monotonic() + 10
        while m.cluster.informer.phase is not Phase.WATCHING and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await m.scan()
        await service.jobs.views_json()
        before = counts()
        new = make_spec(id="new", nodes=("elsewhere",), nnodes=NodeRange(1, 1), submitted_at=1.8e9)
        await asyncio.wait_for(service.jobs.submit(new), 10)  # told by the watch, not after CATCH_UP_S
        await m.scan()  # the one the watch's news woke
        replies = [await service.jobs.views_json() for _ in range(3)]
        watch.cancel()
        return before, counts(), replies

    before, after, replies = asyncio.run(run())
    return Costs(*(a - b for a, b in zip(vars(after).values(), vars(before).values(), strict=True))), replies


def test_a_submit_and_the_status_after_it_cost_the_same_for_a_queue_ten_times_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clustercopy, "CATCH_UP_S", 60.0)  # the submit waits for the watch's news
    made: Counter[str] = Counter()
    for module, name in (
        (clustercopy, "ticket_of"),
        (board, "queue"),
        (statusviews, "held"),
        (statusviews, "reply"),
    ):
        counted(monkeypatch, made, module, name)
    small, small_replies = one_change(20, tmp_path / "small", made)
    large, large_replies = one_change(200, tmp_path / "large", made)
    assert large == small
    # One new job: one ticket, one view encoded; one queue and one reply for the scan and every
    # status after it (the second and third status send the bytes of the first).
    assert (large.tickets, large.encoded, large.queues, large.assembled) == (1, 1, 1, 1)
    assert large.keys_read <= 8  # the new job's keys, never the queue's
    assert large.reads == 0  # the copy, with the new job the watch brought
    assert large.passes == 0  # no request that costs etcd a pass over the queue's keys
    assert large_replies[0] is large_replies[1] is large_replies[2]
    shown = json.loads(large_replies[0])
    assert len(shown) == 201 and shown[-1]["id"] == "new" and shown[-1]["queue"]["of"] == 201
    assert json.loads(small_replies[0])[-1]["queue"] == {
        "place": 5,
        "of": 21,
        "why": "priority 0; u's waiting job 1: users take turns, one job each, whoever was "
        "admitted least recently first (u holds 0 slots)",
    }
