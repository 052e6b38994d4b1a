"""The worker of bench/gpu_check.sh: ``nccl`` (one collective on the GPU, after noting whether
CUDA was initialised before it, by the warm parent), ``affinity`` (the CPUs it may run on, and its
memory policy) or ``hold`` (keep the GPU until told). Writes ``$OUT/<mode>.<round>.json``; waits
for ``$OUT/finish`` (at most 300 s) where it holds on."""

from __future__ import annotations

import json
import os
import sys
import time


def write(name: str, record: dict[str, object]) -> None:
    path = os.path.join(os.environ["OUT"], f"{name}.{os.environ.get('ELASTICD_ROUND', '0')}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def wait_finish() -> None:
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(os.environ["OUT"], "finish")) and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> int:
    mode = sys.argv[1]
    if mode == "affinity":
        from elasticd.workers.zygote_program.mempolicy import current_policy

        try:
            mode_nodes = current_policy()
            policy: object = [mode_nodes[0], sorted(mode_nodes[1])]
        except OSError as exc:
            policy = str(exc)
        write("affinity", {"cpus": sorted(os.sched_getaffinity(0)), "policy": policy})
        return 0
    import torch

    if mode == "nccl":
        record: dict[str, object] = {
            "initialised_at_start": torch.cuda.is_initialized(),
            "bad_fork": torch.cuda._is_in_bad_fork(),
            "ppid": os.getppid(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        import torch.distributed as dist

        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        t = torch.ones(4, device=f"cuda:{local}")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        record |= {
            "sum": t.tolist(),
            "world": dist.get_world_size(),
            "device": torch.cuda.get_device_name(local),
        }
        dist.destroy_process_group()
        write("nccl", record)
        wait_finish()
        return 0
    if mode == "hold":
        torch.zeros(1, device="cuda")
        write("hold", {"visible": os.environ.get("CUDA_VISIBLE_DEVICES")})
        wait_finish()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
