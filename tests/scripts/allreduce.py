"""A real gloo all_reduce across every worker of the round; writes $OUT/ar.<rank>.json."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
with open(os.path.join(os.environ["OUT"], f"ar.{rank}.json"), "w") as f:
    json.dump(
        {
            "rank": rank,
            "world": world,
            "sum": t.item(),
            "env_rank": int(os.environ["RANK"]),
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "node": os.environ["ELASTICD_OWNER"],
            "group_rank": int(os.environ["GROUP_RANK"]),
        },
        f,
    )
dist.destroy_process_group()
