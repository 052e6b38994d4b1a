"""DDP on gloo with a memory snapshot after every step (``worker.save_checkpoint``); on attempt 0,
rank $CRASH_RANK SIGKILLs itself in the middle of step $CRASH_STEP (after its forward pass; with
$CRASH_HOW=raise it raises there instead, while the other ranks wait in that step's data loading
until they are stopped), or
(with $PAUSE_STEP) rank $CRASH_RANK stops after its snapshot of that step and writes $OUT/paused,
for its node to be killed.

Each rank appends every completed step to $OUT/ledger.<attempt>.<rank>; rank 0 writes
$OUT/result.json at the end (the final step, the attempt, the weights).
"""

import json
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from elasticd import worker

out = os.environ["OUT"]
total_steps = int(os.environ.get("STEPS", "20"))
crash_step = int(os.environ.get("CRASH_STEP", "12"))
crash_rank = int(os.environ.get("CRASH_RANK", "1"))
crash_how = os.environ.get("CRASH_HOW", "kill")
pause_step = int(os.environ.get("PAUSE_STEP", "-1"))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ckpt = os.path.join(out, "ckpt.pt")

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
state = worker.load_checkpoint(ckpt)
if state is not None:
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
for step in range(worker.resume_step(state), total_steps):
    gen = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 4, generator=gen)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    if attempt == 0 and rank != crash_rank and step == crash_step and crash_how == "raise":
        signal.pause()  # a slow data loader: this rank never reaches the collective that would fail
    if attempt == 0 and rank == crash_rank and step == crash_step:
        if crash_how == "raise":
            raise RuntimeError(f"rank {rank} fails in step {step}")
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(os.path.join(out, f"ledger.{attempt}.{rank}"), "a") as f:
        f.write(f"{step}\n")
    worker.save_checkpoint(
        {"step": step + 1, "model": model.module.state_dict(), "opt": opt.state_dict()}, ckpt
    )
    worker.step(step)
    if attempt == 0 and rank == crash_rank and step == pause_step:
        with open(os.path.join(out, "paused"), "w") as f:
            f.write(f"{step + 1}\n")
        signal.pause()  # until its node goes
if rank == 0:
    weights = [p.detach().flatten().tolist() for p in model.module.parameters()]
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"final_step": total_steps, "attempt": attempt, "weights": weights}, f)
dist.destroy_process_group()
