"""Multi-node benchmark worker: a torchrun-style script that stamps its first collective per round.

Run under torchrun or elasticd (both set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
TORCHELASTIC_RESTART_COUNT; elasticd also sets ELASTICD_ROUND and ELASTICD_OWNER). It calls
``init_process_group("gloo", init_method="env://")``, then loops: ``all_reduce`` a small tensor,
sleep 0.05 s, until it is killed, gloo raises (a peer died), or ``--max-seconds`` pass (a safety
net: exit 0, so a forgotten worker cannot run forever).

Results go to ``$BENCH_OUT`` (or ``--out``), written atomically (tmp file + rename):

    first.r{ROUND}.{RANK}        time.time() right after the first all_reduce returned
    first.r{ROUND}.{RANK}.json   the same time plus world size, node, pid, restart count, master,
                                 and ``launched``: time.time() when the script started (before torch)

ROUND is ``ELASTICD_ROUND`` when set (elasticd: the rendezvous round, unique per job). Under
torchrun it is ``TORCHELASTIC_RESTART_COUNT``, which torchrun does NOT bump on a membership
change (a node joining re-forms the group with the same count), so it can repeat: the stamp is
then claimed with ``os.link`` (which never overwrites) as ``r{COUNT}+1``, ``r{COUNT}+2``, ...
Every (attempt, rank) therefore leaves its own stamp under both launchers.

The node is ``ELASTICD_OWNER`` (elasticd's node id) or ``BENCH_NODE`` (set by the benchmark in
each torchrun agent's environment). ``--tag`` is ignored: the benchmark passes its trial dir there
so that its own processes can be found by their command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def claim(directory: str, base_round: str, rank: int, value: float, info: dict[str, object]) -> str:
    """Write the stamp under the first free round label; returns the label used."""
    k = 0
    while True:
        label = base_round if k == 0 else f"{base_round}+{k}"
        path = os.path.join(directory, f"first.r{label}.{rank}")
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(repr(value))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and fails instead of overwriting
        except FileExistsError:
            os.unlink(tmp)
            k += 1
            continue
        os.unlink(tmp)
        meta = f"{path}.json"
        with open(f"{meta}.tmp", "w") as f:
            json.dump(info | {"round": label}, f)
        os.replace(f"{meta}.tmp", meta)
        return label


def main() -> None:
    launched = time.time()  # the interpreter is up (before argparse and torch)
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("BENCH_OUT"))
    parser.add_argument("--interval", type=float, default=0.05, help="sleep between collectives")
    parser.add_argument("--max-seconds", type=float, default=180.0, help="exit 0 after this long")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if not args.out:
        sys.exit("multi_worker: set BENCH_OUT (or pass --out)")

    rank = int(os.environ["RANK"])
    restart_count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    round_label = os.environ.get("ELASTICD_ROUND") or restart_count
    started = time.monotonic()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    t = torch.ones(4)
    dist.all_reduce(t)
    now = time.time()
    info = {
        "time": now,
        "launched": launched,
        "rank": rank,
        "world": dist.get_world_size(),
        "node": os.environ.get("ELASTICD_OWNER") or os.environ.get("BENCH_NODE", ""),
        "pid": os.getpid(),
        "restart_count": int(restart_count),
        "elasticd_round": os.environ.get("ELASTICD_ROUND"),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
    }
    claim(args.out, round_label, rank, now, info)

    while time.monotonic() - started < args.max_seconds:
        dist.all_reduce(t)
        time.sleep(args.interval)
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
