"""Memory snapshots against their physical floor and against a disk checkpoint, 2 ranks.

A real keeper process (the daemon's program, started as the daemon starts it) and 2 gloo ranks,
each with a CPU state of ``--mib`` MiB (16 float32 tensors). Each round, interleaved, every rank:

- ``floor``: copies its state into a shared-memory segment it mapped and touched before (a memfd:
  what any in-memory snapshot must at least do);
- ``snapshot``: ``worker.save_checkpoint(state, CKPT, memory=True)`` with persisting off (the
  stall the training loop sees; the file is written behind otherwise);
- ``disk``: ``worker.save_checkpoint(state, CKPT, memory=False)`` of its own state to its own file
  (``torch.save``, fsync, rename, fsync of the directory; each rank writes, as a sharded state
  must), ending in the barrier it always has.

Then, restores: ``worker.load_checkpoint`` from the keeper (tensors mapped copy-on-write: the
copy is left to the training loop's first writes) against ``torch.load`` of the file just written
(from the page cache); and each followed by the copy a script makes next (``load_state_dict``:
into tensors it has), where copy-on-write pays its copy. The file a restore writes behind is
waited for between two timed restores. Medians over ``--rounds`` (after two warm-up snapshots,
which make the keeper's two segments) of the slower rank's time per round.

    python bench/bench_snapshot.py --mib 256 --rounds 7
    python bench/bench_snapshot.py --mib 1024 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def start_keeper(bound: int) -> tuple[subprocess.Popen[bytes], socket.socket, str]:
    from elasticd.workers.warm.keeper import LOADER, program_source

    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    src_r, src_w = os.pipe()
    os.write(src_w, program_source())
    os.close(src_w)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOADER.format(src=src_r, ctl=theirs.fileno())],
        pass_fds=(src_r, theirs.fileno()),
    )
    os.close(src_r)
    theirs.close()
    ctl.send(json.dumps({"bound": bound, "address": ""}).encode())
    return proc, ctl, json.loads(ctl.recv(4096))["socket"]


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from elasticd import worker

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    n = 16
    per = args.mib * (1 << 20) // n // 4
    state = {"step": 0, "model": {f"w{i}": torch.randn(per) for i in range(n)}}
    total = per * 4 * n
    fd = os.memfd_create("floor")
    os.ftruncate(fd, total)
    floor = mmap.mmap(fd, total)
    views = [torch.frombuffer(floor, dtype=torch.float32, count=per, offset=i * per * 4) for i in range(n)]
    for v in views:
        v.fill_(0)  # touched: the floor pays no page faults
    ckpt = Path(args.out) / "mem.pt"
    disk = Path(args.out) / f"disk.{rank}.pt"

    def timed(fn: object) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        return time.perf_counter() - t0

    def copy_floor() -> None:
        for v, t in zip(views, state["model"].values(), strict=True):  # type: ignore[union-attr]
            v.copy_(t)

    def snapshot() -> None:
        worker.save_checkpoint(state, ckpt, memory=True, persist_every=0)

    def to_disk() -> None:
        worker.save_checkpoint(state, disk, rank=rank, memory=False)

    for step in range(2):  # the keeper makes its two segments; the worker maps them
        state["step"] = step
        snapshot()
    rows: dict[str, list[float]] = {"floor": [], "snapshot": [], "disk": []}
    for r in range(args.rounds):
        state["step"] = 2 + r
        rows["floor"].append(timed(copy_floor))
        rows["snapshot"].append(timed(snapshot))
        rows["disk"].append(timed(to_disk))
    loads: dict[str, list[float]] = {
        "restore": [],
        "torch_load": [],
        "restore_copy": [],
        "torch_load_copy": [],
    }
    into = [torch.empty(per) for _ in range(n)]

    def copied(load: object) -> None:
        got = load()  # type: ignore[operator]
        for dst, src in zip(into, got["model"].values(), strict=True):
            dst.copy_(src)

    from elasticd.workers.snapshot_program import memory

    for _ in range(args.rounds):
        loads["restore"].append(timed(lambda: worker.load_checkpoint(ckpt)))
        memory.flush()  # the first restore writes the file behind: not while the next is timed
        loads["torch_load"].append(timed(lambda: torch.load(disk, weights_only=False)))
        loads["restore_copy"].append(timed(lambda: copied(lambda: worker.load_checkpoint(ckpt))))
        memory.flush()
        loads["torch_load_copy"].append(timed(lambda: copied(lambda: torch.load(disk, weights_only=False))))
    mine = {**rows, **loads}
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        slowest = {k: [max(r[k][i] for r in everyone) for i in range(args.rounds)] for k in mine}  # type: ignore[index]
        med = {k: statistics.median(v) for k, v in slowest.items()}
        print(json.dumps({
            "mib_per_rank": args.mib, "ranks": dist.get_world_size(), "rounds": args.rounds,
            "median_s": {k: round(v, 4) for k, v in med.items()},
            "snapshot_over_floor": round(med["snapshot"] / med["floor"], 2),
            "snapshot_over_disk": round(med["snapshot"] / med["disk"], 4),
            "restore_over_torch_load": round(med["restore"] / med["torch_load"], 3),
            "with_copy_ratio": round(med["restore_copy"] / med["torch_load_copy"], 3),
            "floor_gib_s": round(2 * args.mib / 1024 / med["floor"], 1),
            "load_avg": os.getloadavg()[0],
        }), flush=True)  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="state per rank, MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    from elasticd.netaddr import free_port

    ranks = 2
    keeper, ctl, path = start_keeper(bound=ranks * 2 * (args.mib + 8) << 20)
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as out:
            port = free_port()
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ranks))
            env |= {"ELASTICD_SNAPSHOT_SOCKET": path, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
            argv = [
                sys.executable,
                __file__,
                "--rank-main",
                "--mib",
                str(args.mib),
                "--rounds",
                str(args.rounds),
            ]
            procs = [
                subprocess.Popen([*argv, "--out", out], env=env | {"RANK": str(r), "LOCAL_RANK": str(r)})
                for r in range(ranks)
            ]
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"ranks exited {codes}")
    finally:
        ctl.close()
        keeper.wait(10)


if __name__ == "__main__":
    main()
