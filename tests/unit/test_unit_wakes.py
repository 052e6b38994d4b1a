"""Which watch events wake a daemon's agents and scan (elasticd.manager.wakes): a node record's
rewrite wakes no one; its appearance and its removal do."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from elasticd.etcd.keys import KeyKind, Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.manager.wakes import Created, NodeWakes
from tests.fakes import bare_manager

KEYS = Keys("/t")


def node_event(wakes: NodeWakes, node: str, deleted: bool = False) -> bool:
    change = KEYS.route(KEYS.node(node), deleted)
    assert change is not None
    return wakes.wakes(change)


def test_a_live_nodes_rewrite_wakes_no_one_but_its_appearance_and_removal_do() -> None:
    wakes = NodeWakes()
    assert node_event(wakes, "a")  # appears (or is first seen since the watch was armed)
    assert not node_event(wakes, "a")  # its free slots changed
    assert not node_event(wakes, "a")
    assert node_event(wakes, "a", deleted=True)  # its lease ended: a member may be lost
    assert node_event(wakes, "a")  # back, under a new lease
    assert node_event(wakes, "b")
    wakes.forget()  # the watch was re-armed: what it missed is unknown
    assert node_event(wakes, "a") and node_event(wakes, "b")


def test_other_keys_always_wake_as_before() -> None:
    wakes = NodeWakes()
    for key in (KEYS.job_spec("j"), KEYS.job_round("j"), KEYS.drain("a"), KEYS.janitor()):
        change = KEYS.route(key, False)
        assert change is not None
        assert wakes.wakes(change) and wakes.wakes(change)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=40))
def test_every_removal_wakes_and_so_does_the_first_record_after_it(events: list[tuple[str, bool]]) -> None:
    wakes = NodeWakes()
    live: set[str] = set()
    for node, deleted in events:
        woke = node_event(wakes, node, deleted)
        if deleted:
            assert woke
            live.discard(node)
        else:
            assert woke == (node not in live)
            live.add(node)


class CountingAgent:
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self, change: object = None) -> None:
        self.wakes += 1


def test_the_managers_watch_lets_a_node_records_rewrite_wake_no_agent(tmp_path: Path) -> None:
    """The wiring in ``JobManager.wake``. MemoryKV runs watch callbacks in the writer's thread, so
    the wake-up a write causes is queued on the loop before the write's own completion: when the
    write returns here, its wake-up (if any) has run."""

    async def main() -> None:
        kv = MemoryKV()
        manager = bare_manager(kv, KEYS, tmp_path)
        agent = CountingAgent()
        manager.agents["j"] = agent  # type: ignore[assignment]
        watch = asyncio.ensure_future(manager.watch())
        try:
            async with asyncio.timeout(10):
                while agent.wakes == 0:  # until the watch is armed: a key it delivers wakes the agent
                    await asyncio.to_thread(kv.put_json, KEYS.drain("n9"), {"grace_s": None})
                    await asyncio.sleep(0.01)
            for value, woken in ((1, True), (2, False), (3, False)):
                before = agent.wakes
                await asyncio.to_thread(kv.put_json, KEYS.node("n2"), {"free_slots": value})
                await asyncio.sleep(0)
                assert (agent.wakes > before) == woken, (value, agent.wakes, before)
            before = agent.wakes
            await asyncio.to_thread(kv.delete, KEYS.node("n2"))
            await asyncio.sleep(0)
            assert agent.wakes > before
        finally:
            watch.cancel()

    asyncio.run(main())


def test_a_submitters_own_news_is_the_first_of_each_key_it_created_and_no_other() -> None:
    created = Created()
    spec, final = KEYS.route(KEYS.job_spec("j"), False), KEYS.route(KEYS.job_final("j"), False)
    round_, gone = KEYS.route(KEYS.job_round("j"), False), KEYS.route(KEYS.job_round("j"), True)
    assert spec is not None and final is not None and round_ is not None and gone is not None
    assert created.own(spec) and not created.own(spec)  # a second change of the head is news
    assert not created.own(final) and not created.own(gone)  # not written by create; a deletion
    assert created.own(round_) and created.unheard == {KeyKind.RESTARTS}
