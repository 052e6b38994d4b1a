"""A gloo job on the store its launcher hosts: writes $OUT/s.<round>.<rank>.json (the store it was
told of), all-reduces, and in round 0 (or each round $CRASH_ROUNDS names) rank 1 SIGKILLs itself after the
collective; the other rounds end cleanly. With $HOLD, every rank waits for $OUT/finish before it ends."""

import json
import os
import signal
import time

import torch
import torch.distributed as dist

env = os.environ
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
record = {
    "pid": os.getpid(),
    "sum": total.item(),
    "use_agent_store": env["TORCHELASTIC_USE_AGENT_STORE"],
    "master_port": int(env["MASTER_PORT"]),
    "master_addr": env["MASTER_ADDR"],
    "restart_count": int(env["TORCHELASTIC_RESTART_COUNT"]),
}
path = os.path.join(env["OUT"], f"s.{env['ELASTICD_ROUND']}.{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if env["ELASTICD_ROUND"] in env.get("CRASH_ROUNDS", "0").split(",") and rank == 1 and not env.get("HOLD"):
    os.kill(os.getpid(), signal.SIGKILL)
while env.get("HOLD") and not os.path.exists(os.path.join(env["OUT"], "finish")):
    time.sleep(0.05)
dist.barrier()  # in round 0, rank 0 fails here once rank 1 is gone (or the daemon stops it)
dist.destroy_process_group()
