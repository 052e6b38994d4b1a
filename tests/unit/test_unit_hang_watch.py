"""The hang watch's I/O side (``progress.watch``) with its stack dumps faked: a rank that exits
while its stacks are being looked at is not named hung (its exit speaks); one still running is."""

from __future__ import annotations

import asyncio

import pytest

from elasticd.progress import watch as watch_mod
from elasticd.progress.channel import ProgressChannel
from elasticd.progress.decider import Hung
from elasticd.progress.sampler import Dump
from elasticd.progress.timeouts import HangPolicy
from elasticd.progress.watch import HangWatch, WatchedRank

pytestmark = pytest.mark.timeout(30)
HUNG = Hung(rank=0, since=100.0, silent_s=3.5, frame="", reported=True)


def _declare_while(exits_during_look: bool, monkeypatch: pytest.MonkeyPatch) -> HangWatch:
    alive = [True]

    async def look(pid: int, identity: object) -> Dump:
        if exits_during_look:
            alive[0] = False  # py-spy finds the process gone
        return Dump(None, "the process is gone")

    monkeypatch.setattr(watch_mod, "dump_stacks", look)

    async def run() -> HangWatch:
        channel = ProgressChannel()
        watch = HangWatch(
            [WatchedRank(0, 0, channel)],
            HangPolicy(3.0),
            None,
            "job",
            "n1",
            0,
            lambda r, t: None,
            lambda: 104.0,
        )
        watch.attach([(4242, lambda: alive[0])])
        try:
            await watch._declare([HUNG], 104.0)
        finally:
            watch.close()
        return watch

    return asyncio.run(run())


def test_a_rank_that_exits_while_its_stacks_are_looked_at_is_not_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = _declare_while(True, monkeypatch)
    assert watch.failure is None and not watch.hung.done()


def test_a_rank_still_running_after_the_look_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = _declare_while(False, monkeypatch)
    assert watch.failure is not None and watch.failure.rank == 0
    assert watch.hung.done() and watch.hung.result() == 0
