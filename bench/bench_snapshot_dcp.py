"""``torch.distributed.checkpoint`` saves that persist, against torch's own writer, 2 ranks.

A real keeper process (``bench_snapshot.run_ranks``) and 2 gloo ranks, each with a CPU shard of
``--mib`` MiB (16 float32 tensors, a plain state dict: each rank saves its own keys). Each round,
interleaved, every rank times its ``dcp.save`` call (the training loop's stall):

- ``torch``: ``storage_writer=FileSystemWriter(DIR)``: torch writes the step in the call (fsync);
- ``behind``: ``storage_writer=worker.snapshot_writer(DIR, step, persist_every=1)``: the step is
  snapshotted into the keeper, and its directory written behind from the snapshot (``dcpfiles``);
  the write is waited for after the timed call, before the next round, so no round overlaps one;
- ``memory``: the same with ``persist_every=0``: the snapshot alone, what ``behind`` adds to.

Medians over ``--rounds`` (after two warm-up saves, which make the keeper's two segments) of the
slower rank's time per round.

    python bench/bench_snapshot_dcp.py --mib 256 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _timed(fn: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rounds(args: argparse.Namespace, rank: int) -> dict[str, list[float]]:
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    from elasticd import worker
    from elasticd.workers.snapshot_program import dcpfiles

    n = 16
    per = args.mib * (1 << 20) // n // 4
    state: dict[str, Any] = {f"r{rank}.w{i}": torch.randn(per) for i in range(n)}
    out = Path(args.out)
    mine, theirs = out / "elasticd", out / "torch"

    def behind(step: int, every: int) -> None:
        save(state, storage_writer=worker.snapshot_writer(mine, step, persist_every=every))

    for step in range(2):
        behind(step, 0)
    rows: dict[str, list[float]] = {"torch": [], "behind": [], "memory": []}
    for i in range(args.rounds):
        step = 2 + 2 * i
        rows["torch"].append(_timed(lambda: save(state, storage_writer=FileSystemWriter(theirs))))
        rows["behind"].append(_timed(lambda s=step: behind(s, 1)))
        dcpfiles.behind(mine).wait()  # untimed: the write behind ends before the next round
        rows["memory"].append(_timed(lambda s=step + 1: behind(s, 0)))
    return rows


def rank_main(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")  # torch's, every round
    dist.init_process_group("gloo", init_method="env://")
    mine = _rounds(args, dist.get_rank())
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        slowest = {k: [max(r[k][i] for r in everyone) for i in range(args.rounds)] for k in mine}
        med = {k: statistics.median(v) for k, v in slowest.items()}
        print(json.dumps({
            "mib_per_rank": args.mib, "ranks": dist.get_world_size(), "rounds": args.rounds,
            "median_s": {k: round(v, 4) for k, v in med.items()},
            "behind_over_torch": round(med["behind"] / med["torch"], 4),
            "behind_over_memory": round(med["behind"] / med["memory"], 2),
            "load_avg": os.getloadavg()[0],
        }), flush=True)  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    from bench_snapshot import bench_main

    bench_main(__doc__ or "", __file__, rank_main, "shard per rank, MiB")


if __name__ == "__main__":
    main()
