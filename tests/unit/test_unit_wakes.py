"""Which changes wake a daemon's agents (elasticd.manager.wakes, manager.presence): no node record
reaches any daemon's watch; a node's presence in a job reaches that job's agents alone, and only
when it goes (its agent left, or its lease ended)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.etcd.keyref import Change, KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.manager.presence import PresenceWatches
from tests.fakes import bare_manager

KEYS = Keys("/t")


class CountingAgent:
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self, change: object = None) -> None:
        self.wakes += 1


def test_no_node_record_wakes_any_agent_of_the_managers_watch(tmp_path: Path) -> None:
    """The wiring in ``ClusterCopy``. MemoryKV runs watch callbacks in the writer's thread, in
    revision order: once job k's agent has been woken by a later write, the node records' writes
    before it were delivered (or not) already."""

    async def main() -> None:
        kv = MemoryKV()
        manager = bare_manager(kv, KEYS, tmp_path)
        j, k = CountingAgent(), CountingAgent()
        manager.agents.update({"j": j, "k": k})  # type: ignore[dict-item]
        watch = asyncio.ensure_future(manager.cluster.run())
        try:
            async with asyncio.timeout(10):
                while k.wakes == 0:  # until the watch is armed
                    await asyncio.to_thread(kv.put_json, KEYS.waiting("k", "n9"), {})
                    await asyncio.sleep(0.01)
                before = j.wakes, k.wakes
                lease = kv.grant_lease(10)
                for value in (1, 2):
                    await asyncio.to_thread(kv.put_json, KEYS.node("n2"), {"free_slots": value}, lease)
                await asyncio.to_thread(kv.revoke_lease, lease)  # the record goes with its lease
                await asyncio.to_thread(kv.put_json, KEYS.waiting("k", "n8"), {})
                while k.wakes == before[1]:
                    await asyncio.sleep(0.01)
                assert j.wakes == before[0]
        finally:
            watch.cancel()

    asyncio.run(main())


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("jk"), st.sampled_from(["a", "b", "c"]), st.booleans()), max_size=12)
)
def test_a_presence_wakes_its_jobs_agents_on_its_deletion_only(events: list[tuple[str, str, bool]]) -> None:
    """Each deletion of a presence of a followed job is one wake-up of that job, in order; a put
    (a node entering the job, or re-entering under a new lease) and other jobs' keys are none."""

    async def main() -> None:
        kv = MemoryKV()
        woken: list[Change] = []
        watches = PresenceWatches(kv, KEYS, woken.append)
        await watches.follow("j")
        expected = []
        try:
            for job, node, deleted in events:
                if deleted:
                    existed = await asyncio.to_thread(kv.delete, KEYS.presence(job, node))
                    if existed and job == "j":
                        expected.append(node)
                else:
                    await asyncio.to_thread(kv.put_json, KEYS.presence(job, node), {})
            await asyncio.to_thread(kv.put_json, KEYS.presence("j", "z"), {})
            await asyncio.to_thread(kv.delete, KEYS.presence("j", "z"))  # the witness: last
            async with asyncio.timeout(10):
                while not woken or woken[-1].ref is None or woken[-1].ref.node != "z":
                    await asyncio.sleep(0.001)
        finally:
            watches.close()
        assert [c.ref.node for c in woken if c.ref is not None] == [*expected, "z"]
        assert all(c.job == "j" and c.deleted and c.kind is KeyKind.PRESENCE for c in woken)

    asyncio.run(main())


def test_a_lease_end_wakes_the_job_and_a_broken_watch_is_rearmed_with_a_wake(tmp_path: Path) -> None:
    async def main() -> None:
        kv = MemoryKV()
        woken: list[Change] = []
        watches = PresenceWatches(kv, KEYS, woken.append)
        await watches.follow("j")
        try:
            lease = kv.grant_lease(10)
            await asyncio.to_thread(kv.put_json, KEYS.presence("j", "a"), {}, lease)
            await asyncio.to_thread(kv.revoke_lease, lease)
            async with asyncio.timeout(10):
                while len(woken) < 1:
                    await asyncio.sleep(0.001)
                assert woken[0].ref is not None and woken[0].ref.node == "a"
                kv.break_watches()
                while len(woken) < 2:  # the re-arm's wake-up: the job's agents look
                    await asyncio.sleep(0.001)
                assert woken[1].job == "j" and woken[1].kind is KeyKind.PRESENCE
                await asyncio.to_thread(kv.put_json, KEYS.presence("j", "b"), {})
                await asyncio.to_thread(kv.delete, KEYS.presence("j", "b"))
                while len(woken) < 3:  # the re-armed watch hears deletions again
                    await asyncio.sleep(0.001)
            assert woken[2].ref is not None and woken[2].ref.node == "b"
            assert watches.followed() == {"j"}
        finally:
            watches.close()
        assert watches.followed() == frozenset()

    asyncio.run(main())
