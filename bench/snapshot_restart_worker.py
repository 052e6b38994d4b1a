"""The worker of ``bench_snapshot_restart.py``: 2 gloo ranks, DDP over a state of $MIB MiB, a
memory snapshot after every step. On attempt 0, rank 1 writes the wall time and SIGKILLs itself at
the start of step $KILL_STEP; on attempt 1 each rank writes when ``load_checkpoint`` began and
returned, and when its first step after it completed ($OUT/times.<rank>.json); and when the script
started (its imports done)."""

import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from elasticd import worker

started = time.time()  # the script runs: imports done (torch came with the zygote)
out = os.environ["OUT"]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
kill_step, steps = int(os.environ.get("KILL_STEP", "5")), int(os.environ.get("STEPS", "8"))
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)
per = int(os.environ.get("MIB", "64")) * (1 << 20) // 4
model = DDP(torch.nn.Linear(per // 1024, 1024, bias=False))
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
ckpt = os.path.join(out, "ckpt.pt")
began = time.time()
state = worker.load_checkpoint(ckpt)
restored = time.time()
if state is not None:
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
loaded = time.time()
for step in range(worker.resume_step(state), steps):
    if attempt == 0 and rank == 1 and step == kill_step:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.randn(4, per // 1024)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    worker.save_checkpoint(
        {"step": step + 1, "model": model.module.state_dict(), "opt": opt.state_dict()}, ckpt
    )
    if attempt == 1 and step == worker.resume_step(state):
        with open(os.path.join(out, f"times.{rank}.json"), "w") as f:
            json.dump({"started": started, "began": began, "restored": restored, "loaded": loaded,
                       "first_step": time.time(), "step": step}, f)  # fmt: skip
dist.destroy_process_group()
