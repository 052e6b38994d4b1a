"""Benchmark worker: a torchrun-style script that timestamps its first collective.

Run under torchrun or elasticd (both set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
TORCHELASTIC_RESTART_COUNT). Results go to ``$BENCH_OUT`` (or ``--out``):

    first_collective.a{ATTEMPT}.r{RANK}   time.time() right after the first all_reduce returned
    crash.a0                              time.time() just before rank 1 crashes (--mode crash)

Modes:
    start   exit 0 right after the first collective.
    crash   attempt 0: after the first collective, rank 1 sleeps 0.5 s, writes crash.a0 and
            calls os._exit(1); the other ranks keep calling all_reduce until they error out or
            are killed. Attempt >= 1: everyone exits 0 after the first collective.

``--tag`` is ignored; the benchmark passes its temp dir there so that its own processes can be
told apart from anyone else's by their command line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def write_stamp(directory: str, name: str, value: float) -> None:
    """Atomically write ``value`` to ``directory/name`` (tmp file, then rename)."""
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(repr(value))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("start", "crash"), default="start")
    parser.add_argument("--out", default=os.environ.get("BENCH_OUT"))
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if not args.out:
        sys.exit("worker: set BENCH_OUT (or pass --out)")

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    t = torch.ones(4)
    dist.all_reduce(t)
    now = time.time()
    write_stamp(args.out, f"first_collective.a{attempt}.r{rank}", now)

    if args.mode == "crash" and attempt == 0:
        if rank == 1:
            time.sleep(0.5)
            write_stamp(args.out, "crash.a0", time.time())
            os._exit(1)
        # Everyone else keeps the group busy until the peer's death breaks the collective
        # (gloo raises) or the launcher kills us.
        while True:
            dist.all_reduce(t)
            time.sleep(0.01)

    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
