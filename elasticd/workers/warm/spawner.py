"""A group's workers forked from a zygote (``elasticd.workers.group.Spawner``), cold when it cannot."""

from __future__ import annotations

import asyncio

from elasticd import log
from elasticd.workers import numa_memory
from elasticd.workers.group import Launch, Spawner
from elasticd.workers.warm.spawn import ZygoteError
from elasticd.workers.warm.zygote import Zygote, ZygoteState

_log = log.get("elasticd.zygote")


class WarmSpawner:
    """Workers forked from the job's zygote while it is usable; cold otherwise, and for any fork it
    does not carry out (``elasticd.workers.group.Spawner``)."""

    def __init__(self, zygote: Zygote, cold: Spawner) -> None:
        self._zygote = zygote
        self._cold = cold

    @property
    def mode(self) -> str:
        return "warm" if self._zygote.usable else "cold"

    async def spawn(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        if self._zygote.usable:
            if launch.mems:  # the forked worker sets its policy itself: a refusal is logged here
                numa_memory.checked(launch.mems)
            try:
                return await self._zygote.fork(launch, procs_fd)
            except ZygoteError as exc:
                _log.warning("zygote.fork_failed", job=self._zygote.job, rank=launch.rank, error=str(exc))
        return await self._cold.spawn(launch, procs_fd)

    def spared(self) -> frozenset[int]:
        z = self._zygote
        if z.pid is None or z.state is not ZygoteState.READY:
            return frozenset()
        return frozenset({z.pid, *z.helpers})  # the store host outlives the group, as the zygote

    def markers(self) -> frozenset[str]:
        return frozenset({self._zygote.marker})
