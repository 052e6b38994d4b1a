"""DDP on gloo with checkpoints; rank $CRASH_RANK crashes once at step $CRASH_STEP of attempt 0.

Writes $OUT/result.json on rank 0 at the end: the final step, the restart count and the weights.
Each completed optimizer step is appended to $OUT/ledger.<attempt>.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out = os.environ["OUT"]
total_steps = int(os.environ.get("STEPS", "30"))
every = int(os.environ.get("CKPT_EVERY", "5"))
crash_step = int(os.environ.get("CRASH_STEP", "12"))
crash_rank = int(os.environ.get("CRASH_RANK", "1"))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ckpt = os.path.join(out, "ckpt.pt")

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
for step in range(start, total_steps):
    if attempt == 0 and rank == crash_rank and step == crash_step:
        print(f"rank {rank} crashing at step {step}", file=sys.stderr, flush=True)
        os._exit(17)
    gen = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 4, generator=gen)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        with open(os.path.join(out, f"ledger.{attempt}"), "a") as f:
            f.write(f"{step}\n")
        if (step + 1) % every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
    dist.barrier()
if rank == 0:
    weights = [p.detach().flatten().tolist() for p in model.module.parameters()]
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(
            {
                "final_step": total_steps,
                "attempt": attempt,
                "weights": weights,
                "world_size": dist.get_world_size(),
            },
            f,
        )
# Every rank is past its last collective before any tears the group down, and none runs the
# interpreter's finalisation after: gloo's threads met at process exit aborted a rank now and then
# on a loaded host ("terminate called without an active exception", SIGABRT), under plain
# torchrun as under elasticrun. Everything is written and the group destroyed by then.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
