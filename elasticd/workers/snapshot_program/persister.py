"""The child a keeper starts to write a snapshot to its checkpoint file (``filing``): the job's
own interpreter, as the submitter, given a read-only fd of the segment. The frame is read back as
views of the segment (which the keeper pinned: nobody writes it again) and saved atomically as the
workers save (``memory.write_file``); a ``torch.distributed.checkpoint`` directory's shard or
commit as the workers' threads write them (``dcpfiles.from_keeper``).

It runs while the job's next workers may be starting, so it yields the CPU to them (a nice of
10 before it imports torch: ``SCHED_IDLE`` could starve it on a busy node past the keeper's bound).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(OSError):
        os.nice(10)
    fd_text, length_text, step_text, target = (argv if argv is not None else sys.argv[1:])[:4]
    from elasticd.workers.snapshot_program import frame
    from elasticd.workers.snapshot_program.filing import DCP_META, slot_name
    from elasticd.workers.snapshot_program.memory import write_file

    fd, length, step = int(fd_text), int(length_text), int(step_text)
    buf = mmap.mmap(fd, length, prot=mmap.PROT_READ)  # the tensors view it until we exit
    os.close(fd)
    got, state = frame.read(buf, views=True)
    if got != step:
        raise SystemExit(f"the segment holds step {got}, not {step}")
    if slot_name(target) != target or target.endswith(DCP_META):  # a checkpoint directory's
        from elasticd.workers.snapshot_program.dcpfiles import from_keeper

        from_keeper(target, step, state)
        return
    write_file(state, Path(target))
