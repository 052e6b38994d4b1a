"""What a script may rely on from its launcher (the checks torch's own launcher test scripts
make): it was launched by torchelastic, the rank variables agree with the process group, and a
collective works. Writes $OUT/contract.<RANK>.json with what must not depend on the launcher."""

import json
import os
import sys

import torch
import torch.distributed as dist

env = os.environ
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank])
dist.all_reduce(total)
record = {
    "is_torchelastic_launched": dist.is_torchelastic_launched(),
    "rank": rank,
    "world_size": world,
    "env_rank": int(env["RANK"]),
    "env_world_size": int(env["WORLD_SIZE"]),
    "local_rank": int(env["LOCAL_RANK"]),
    "local_world_size": int(env["LOCAL_WORLD_SIZE"]),
    "group_rank": int(env["GROUP_RANK"]),
    "role_rank": int(env["ROLE_RANK"]),
    "role_world_size": int(env["ROLE_WORLD_SIZE"]),
    "restart_count": int(env["TORCHELASTIC_RESTART_COUNT"]),
    "max_restarts": int(env["TORCHELASTIC_MAX_RESTARTS"]),
    "has_run_id": bool(env.get("TORCHELASTIC_RUN_ID")),
    "use_agent_store": env.get("TORCHELASTIC_USE_AGENT_STORE"),
    "master": bool(env.get("MASTER_ADDR")) and env.get("MASTER_PORT", "").isdigit(),
    "sum_of_ranks": int(total.item()),
    "argv": sys.argv[1:],
}
with open(os.path.join(env["OUT"], f"contract.{rank}.json"), "w") as f:
    json.dump(record, f, sort_keys=True)
dist.destroy_process_group()
