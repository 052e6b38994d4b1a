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
import fcntl
import json
import mmap
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def start_keeper(bound: int) -> tuple[subprocess.Popen[bytes], socket.socket, str]:
    from elasticd.workers.proctree.helper import PIPE_BYTES
    from elasticd.workers.warm.snapshotkeeper import KEEPER

    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    src_r, src_w = os.pipe()
    fcntl.fcntl(src_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # as ``helper.launch``: the program fits whole
    os.write(src_w, KEEPER.source())
    os.close(src_w)
    proc = subprocess.Popen(
        [sys.executable, "-c", KEEPER.loader(src_r, theirs.fileno())],
        pass_fds=(src_r, theirs.fileno()),
    )
    os.close(src_r)
    theirs.close()
    ctl.send(json.dumps({"bound": bound, "address": ""}).encode())
    return proc, ctl, json.loads(ctl.recv(4096))["socket"]


def _timed(fn: Callable[[], object]) -> float:
    """Seconds of ``fn`` on this rank, every rank starting together."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass
class _Rank:
    """One rank's state, its floor segment and its two checkpoint paths."""

    args: argparse.Namespace
    state: dict[str, Any]
    views: list[Any]  # the floor: tensors over a touched memfd, one per state tensor
    ckpt: Path
    disk: Path
    rank: int

    def copy_floor(self) -> None:
        for v, t in zip(self.views, self.state["model"].values(), strict=True):
            v.copy_(t)

    def snapshot(self) -> None:
        from elasticd import worker

        worker.save_checkpoint(self.state, self.ckpt, memory=True, persist_every=0)

    def to_disk(self) -> None:
        from elasticd import worker

        worker.save_checkpoint(self.state, self.disk, rank=self.rank, memory=False)


def _rank(args: argparse.Namespace, rank: int) -> _Rank:
    import torch

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
    return _Rank(args, state, views, Path(args.out) / "mem.pt", Path(args.out) / f"disk.{rank}.pt", rank)


def _time_saves(r: _Rank) -> dict[str, list[float]]:
    for step in range(2):  # the keeper makes its two segments; the worker maps them
        r.state["step"] = step
        r.snapshot()
    rows: dict[str, list[float]] = {"floor": [], "snapshot": [], "disk": []}
    for i in range(r.args.rounds):
        r.state["step"] = 2 + i
        rows["floor"].append(_timed(r.copy_floor))
        rows["snapshot"].append(_timed(r.snapshot))
        rows["disk"].append(_timed(r.to_disk))
    return rows


def _time_restores(r: _Rank) -> dict[str, list[float]]:
    import torch

    from elasticd import worker
    from elasticd.workers.snapshot_program import memory

    into = [torch.empty_like(v) for v in r.views]

    def copied(load: Callable[[], Any]) -> None:
        for dst, src in zip(into, load()["model"].values(), strict=True):
            dst.copy_(src)

    def restore() -> Any:
        return worker.load_checkpoint(r.ckpt)

    def torch_load() -> Any:
        return torch.load(r.disk, weights_only=False)

    loads: dict[str, list[float]] = {
        "restore": [],
        "torch_load": [],
        "restore_copy": [],
        "torch_load_copy": [],
    }
    for _ in range(r.args.rounds):
        loads["restore"].append(_timed(restore))
        memory.flush()  # the first restore writes the file behind: not while the next is timed
        loads["torch_load"].append(_timed(torch_load))
        loads["restore_copy"].append(_timed(lambda: copied(restore)))
        memory.flush()
        loads["torch_load_copy"].append(_timed(lambda: copied(torch_load)))
    return loads


def _report(args: argparse.Namespace, everyone: list[dict[str, list[float]]], ranks: int) -> None:
    keys = everyone[0]
    slowest = {k: [max(r[k][i] for r in everyone) for i in range(args.rounds)] for k in keys}
    med = {k: statistics.median(v) for k, v in slowest.items()}
    print(json.dumps({
        "mib_per_rank": args.mib, "ranks": ranks, "rounds": args.rounds,
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "snapshot_over_floor": round(med["snapshot"] / med["floor"], 2),
        "snapshot_over_disk": round(med["snapshot"] / med["disk"], 4),
        "restore_over_torch_load": round(med["restore"] / med["torch_load"], 3),
        "with_copy_ratio": round(med["restore_copy"] / med["torch_load_copy"], 3),
        "floor_gib_s": round(2 * args.mib / 1024 / med["floor"], 1),
        "load_avg": os.getloadavg()[0],
    }), flush=True)  # fmt: skip


def rank_main(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    r = _rank(args, dist.get_rank())
    mine = {**_time_saves(r), **_time_restores(r)}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if r.rank == 0:
        _report(args, everyone, dist.get_world_size())
    dist.destroy_process_group()


def main() -> None:
    bench_main(__doc__ or "", __file__, rank_main, "state per rank, MiB")


def bench_main(doc: str, script: str, rank_main: Callable[[argparse.Namespace], None], mib_help: str) -> None:
    """A 2-rank snapshot bench's command line: ``--mib`` and ``--rounds``; as a rank
    (``--rank-main``), ``rank_main``; else the ranks, run on a keeper (``run_ranks``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help=mib_help)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--bound",
        choices=("derived", "fit"),
        default="derived",
        help="the keeper's bound: the one a daemon derives on this host with snapshot_bytes unset"
        " (default), or just what two snapshots per rank need",
    )
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    run_ranks(script, args.mib, ["--mib", str(args.mib), "--rounds", str(args.rounds)], bound=args.bound)


def run_ranks(script: str, mib: int, argv: list[str], ranks: int = 2, bound: str = "fit") -> None:
    """Start a keeper bounded for two snapshots of ``mib`` MiB per rank (``bound="derived"``: as a
    daemon of this host bounds it by default), run ``script --rank-main argv`` as ``ranks`` gloo
    ranks on it (their ``--out``: a temporary directory), and stop the keeper."""
    from elasticd.netaddr import free_port
    from elasticd.node import hostmemory
    from elasticd.node.snapshotbound import derive

    need = ranks * 2 * (mib + 8) << 20
    size = derive(hostmemory.read()) if bound == "derived" else need
    if size < need:
        raise SystemExit(f"this host's derived bound, {size} bytes, is under the {need} the bench needs")
    print(f"keeper bound: {size} bytes ({bound})", file=sys.stderr)
    keeper, ctl, path = start_keeper(bound=size)
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as out:
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            env |= {"WORLD_SIZE": str(ranks), "ELASTICD_SNAPSHOT_SOCKET": path, "OMP_NUM_THREADS": "1"}
            env["PYTHONPATH"] = str(REPO)
            cmd = [sys.executable, script, "--rank-main", *argv, "--out", out]
            procs = [
                subprocess.Popen(cmd, env=env | {"RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(ranks)
            ]
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"ranks exited {codes}")
    finally:
        ctl.close()
        keeper.wait(10)


if __name__ == "__main__":
    main()
