"""Admission and allocation: whether this node takes part in a job, and with which slots.

The rule is pure (``elasticd.jobs.admission``); this module applies it with the node's own
state (free slots, drain, its config) and tells the job why it cannot take part, if it cannot.
"""

from __future__ import annotations

import os

from elasticd import log
from elasticd.jobs.admission import admit, refuse
from elasticd.jobs.attempt import NodeRuntime
from elasticd.node.allocator import Allocator
from elasticd.rendezvous.jobread import JobRead, JoinsRead
from elasticd.rendezvous.jobstore import JobStore
from elasticd.rendezvous.model import DrainRecord
from elasticd.terms.state import JobState

_log = log.get("elasticd.jobs")


class Admitter:
    def __init__(self, rt: NodeRuntime, allow_root_jobs: bool) -> None:
        self._rt = rt
        self._allow_root_jobs = allow_root_jobs  # this node's own config, whatever a spec says
        self._uid = os.geteuid()
        devices = rt.inventory.devices
        self.allocator = Allocator(
            rt.inventory.slots, link=rt.inventory.slot_link, mig=[d.mig for d in devices]
        )
        self.draining: DrainRecord | None = None  # this node's drain record, while drained

    @property
    def unit(self) -> str:
        return "GPUs" if self._rt.inventory.gpus else "CPU slots"

    async def consider(self, read: JobRead, store: JobStore, lease: int | None) -> tuple[int, ...] | None:
        """The slots this node takes the job with, or None (and why, in the job's pending notes)."""
        assert read.head is not None
        head, node = read.head, self._rt.node_id
        refusal = refuse(head, node, self._uid, self._allow_root_jobs)
        if refusal is not None:
            if await store.finalize(JobState.FAILED, refusal.code, refusal.reason):
                _log.warning("job.refused", job=head.id, code=refusal.code.value, reason=refusal.reason)
            return None
        free = len(self.allocator.free(head.mig))
        unit = "MIG slices" if head.mig else self.unit
        slots, draining, alone = (
            self._rt.inventory.slots,
            self.draining is not None,
            self._rt.single_host_only,
        )
        # The read of every job carries no join: first decided as if no node had joined the
        # open round (more joins only take seats away), and the joins counted (one small
        # request) only where that would join or write a note, so that a queue of waiting jobs
        # costs no request per job and scan.
        counted = None if isinstance(read, JoinsRead) else 0
        decision = admit(read, node, free, slots, unit, draining, alone, joined=counted)
        acts = decision.join or decision.note != read.pending.get(node)
        if counted is not None and read.closed is None and acts:
            counted = await store.count_joins(read.current)
            decision = admit(read, node, free, slots, unit, draining, alone, joined=counted)
        # Written only when it differs from what the job's read holds: with many pending jobs,
        # a scan must not rewrite every one's note (nor a restarted daemon, while they hold).
        if decision.note != read.pending.get(node) and lease is not None and read.closed is None:
            await store.note_pending(node, decision.note, lease)
        if not decision.join:
            return None
        return self.allocator.allocate(head.id, head.nproc_per_node, head.mig)

    def release(self, job_id: str) -> None:
        self.allocator.release(job_id)
