"""A plain torchrun script: synchronous DDP on gloo, no call into elasticd. Trains until $OUT/stop
exists (every rank learns it at the same step, through an all_reduce), writing its pid to
$OUT/pid.<rank> once training runs (and, with STEPS_FILE set, its step count to $OUT/steps.<rank>
every 10 steps: bench/bench_stragglers.py). With STEP_SLEEP_S, each step also sleeps that long, as
one waiting for its data loader would: a job that leaves a shared test host's cores some idle time."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
stop = os.path.join(os.environ["OUT"], "stop")
with open(os.path.join(os.environ["OUT"], f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
steps = 0
counts = os.path.join(os.environ["OUT"], f"steps.{rank}") if os.environ.get("STEPS_FILE") else None
pause = float(os.environ.get("STEP_SLEEP_S", "0"))
while True:
    flag = torch.tensor([float(os.path.exists(stop))])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        break
    x = torch.randn(256, 256)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if pause:
        time.sleep(pause)
    steps += 1
    if counts is not None and steps % 10 == 0:
        with open(counts, "w") as f:
            f.write(str(steps))
print(f"rank {rank} stopped after {steps} steps", flush=True)
dist.destroy_process_group()
