"""Memory snapshots of CUDA state: the stall against device-to-host copies into shared memory,
pinned and pageable (one rank, one GPU; run where a GPU is lent).

The state is ``--mib`` MiB of float32 on the GPU (16 tensors). Each round, interleaved:

- ``pinned``: the copy into a segment registered with CUDA, on a stream of its own (what a
  snapshot's copy is: ``snapshot_program.device``), waited for;
- ``pageable``: ``copy_`` into an unregistered segment (what a copy into shared memory costs
  without the registration);
- ``snapshot``: ``worker.save_checkpoint(state, CKPT, memory=True)`` (persisting off);
- ``gpu_busy``: the same snapshot while the loop's stream still runs queued matrix products (the
  snapshot waits for them, as it must, then copies; reported with the products' own time).

Then a restore, checked equal to the state. Medians over ``--rounds``; the first snapshot (which
makes and registers the segments) is reported apart.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is scripts, not a package

from bench_snapshot import start_keeper  # noqa: E402


def _segments(total: int, n: int, per: int) -> tuple[bool, list[list[Any]]]:
    """Two touched memfd segments, the first registered with CUDA; per segment, ``n`` views."""
    import torch

    from elasticd.workers.snapshot_program import device

    segments = []
    for _ in range(2):
        fd = os.memfd_create("floor")
        os.ftruncate(fd, total)
        segments.append(mmap.mmap(fd, total))
    for buf in segments:
        torch.frombuffer(buf, dtype=torch.uint8).fill_(0)  # touched
    pinned_ok = device.register(segments[0])
    views = [
        [torch.frombuffer(buf, dtype=torch.float32, count=per, offset=i * per * 4) for i in range(n)]
        for buf in segments
    ]
    return pinned_ok, views


def _timed(fn: Callable[[], object]) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _rounds(args: argparse.Namespace, kinds: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median seconds of each kind, interleaved over ``args.rounds`` rounds."""
    rows: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for k, fn in kinds.items():
            rows[k].append(_timed(fn))
    return {k: statistics.median(v) for k, v in rows.items()}


def _summary(
    args: argparse.Namespace, med: dict[str, float], times: tuple[float, float], same: bool, pinned_ok: bool
) -> dict[str, object]:
    import torch

    first, restore_s = times
    return {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mib": args.mib,
        "rounds": args.rounds, "registered": pinned_ok, "first_snapshot_s": round(first, 4),
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "snapshot_over_pinned": round(med["snapshot"] / med["pinned"], 3),
        "snapshot_over_pageable": round(med["snapshot"] / med["pageable"], 3),
        "pinned_gib_s": round(args.mib / 1024 / med["pinned"], 1),
        "snapshot_gib_s": round(args.mib / 1024 / med["snapshot"], 1),
        "busy_minus_products_s": round(med["busy"] - med["products"], 4),
        "restore_s": round(restore_s, 4), "restored_equal": same,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch

    from elasticd import worker
    from elasticd.workers.snapshot_program import device
    from elasticd.workers.snapshot_program.memory import SNAPSHOTS

    n, per = 16, args.mib * (1 << 20) // 16 // 4
    total = n * per * 4
    keeper, ctl, path = start_keeper(bound=3 * total + (64 << 20))
    os.environ["ELASTICD_SNAPSHOT_SOCKET"] = path
    state: dict[str, Any] = {"step": 0, "model": {f"w{i}": torch.randn(per, device="cuda") for i in range(n)}}
    pinned_ok, views = _segments(total, n, per)
    tensors = list(state["model"].values())

    def pinned() -> None:
        device.copy_out(list(zip(views[0], tensors, strict=True)))

    def pageable() -> None:
        for dst, src in zip(views[1], tensors, strict=True):
            dst.copy_(src)

    with tempfile.TemporaryDirectory() as out:
        ckpt = Path(out) / "ckpt.pt"

        def snapshot() -> None:
            state["step"] = int(state["step"]) + 1
            worker.save_checkpoint(state, ckpt, memory=True, persist_every=0)

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

        def products() -> None:
            for _ in range(20):
                a @ a

        first = _timed(snapshot)
        _timed(snapshot)
        kinds = {"pinned": pinned, "pageable": pageable, "snapshot": snapshot, "products": products}

        def busy() -> None:
            products()
            snapshot()

        med = _rounds(args, {**kinds, "busy": busy})
        t0 = time.perf_counter()
        back = worker.load_checkpoint(ckpt)
        restore_s = time.perf_counter() - t0
        same = all(torch.equal(back["model"][k], v.cpu()) for k, v in state["model"].items())
        SNAPSHOTS.at_exit()  # the file written behind lands before its directory goes, not after
        print(json.dumps(_summary(args, med, (first, restore_s), same, pinned_ok)), flush=True)
    ctl.close()
    keeper.wait(10)


if __name__ == "__main__":
    main()
