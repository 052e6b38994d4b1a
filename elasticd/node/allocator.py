"""Which of this host's slots (GPUs or CPU slots) each job holds. Pure: no I/O.

Two jobs never hold the same slot, so their CUDA_VISIBLE_DEVICES are disjoint. A slot ``out`` of
the pool (an unhealthy GPU's) is never handed out; a job that holds one keeps it until it is
released (its node leaves the job, ``manager/gpus.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elasticd.gpu.placement import LinkOf, choose
from elasticd.gpu.topology import Link


def _unknown(a: int, b: int) -> Link:
    return Link.SYSTEM


class Allocator:
    def __init__(
        self,
        capacity: int,
        held: Mapping[str, tuple[int, ...]] | None = None,
        link: LinkOf | None = None,
        mig: Sequence[bool] = (),
    ) -> None:
        self.capacity = capacity
        self._mig = frozenset(s for s, is_mig in enumerate(mig) if is_mig)  # slots that are MIG slices
        self._link = link or _unknown  # how two slots are linked (``Inventory.slot_link``)
        self._held: dict[str, tuple[int, ...]] = dict(held or {})
        self.out: frozenset[int] = frozenset()

    @property
    def held(self) -> dict[str, tuple[int, ...]]:
        return dict(self._held)

    def free(self, mig: bool | None = None) -> list[int]:
        """Free slots: all, or only MIG slices (``mig``) or only whole GPUs (``not mig``)."""
        taken = {s for slots in self._held.values() for s in slots} | self.out
        return [
            s for s in range(self.capacity) if s not in taken and (mig is None or (s in self._mig) == mig)
        ]

    def holders(self, slots: frozenset[int]) -> list[str]:
        """The jobs that hold any of ``slots``."""
        return sorted(job for job, held in self._held.items() if slots & set(held))

    def fits_host(self, count: int) -> bool:
        return 0 < count <= self.capacity

    def allocate(self, job_id: str, count: int, mig: bool = False) -> tuple[int, ...] | None:
        """``count`` free slots for ``job_id`` with the best common link (``gpu/placement.py``;
        the lowest ones when the topology is unknown), or None if not enough are free now. A MIG
        job (``mig``) gets MIG slices only, any other job whole GPUs only: a whole-GPU job never
        lands on a partitioned GPU."""
        if count < 1:
            raise ValueError(f"a job needs at least one slot, asked for {count}")
        if job_id in self._held:
            return self._held[job_id]
        free = self.free(mig)
        chosen = choose(free, count, self._link)
        if chosen is None:
            return None
        self._held[job_id] = chosen
        return chosen

    def release(self, job_id: str) -> None:
        self._held.pop(job_id, None)
