"""The worker of ``bench_snapshot_restart.py``: 2 gloo ranks, DDP over a state of $MIB MiB, a
memory snapshot after every step. On attempt 0, rank 1 writes the wall time and SIGKILLs itself at
the start of step $KILL_STEP; on attempt 1 each rank writes its times ($OUT/times.<rank>.json):
when the script started (its imports done), joined the process group, began and returned from
``load_checkpoint``, had loaded the state, and completed its first step; and how long building
the model and wrapping it in DDP took.

$ORDER=restore-first (the recipe for a fast restart): ``load_checkpoint`` right after the process
group, then the model built without its random init when a state was restored (``skip_init``: the
state overwrites it) and DDP without its initial broadcast (``init_sync=False``: every rank loaded
the same step). $ORDER=build-first: the model (random init) and DDP (a broadcast of it) first,
then the restore, as most scripts are written.
"""

import json
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from elasticd import worker

started = time.time()  # the script runs: imports done (torch came with the zygote)
out = os.environ["OUT"]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
kill_step, steps = int(os.environ.get("KILL_STEP", "5")), int(os.environ.get("STEPS", "8"))
restore_first = os.environ.get("ORDER", "restore-first") == "restore-first"
dist.init_process_group("gloo", init_method="env://")
joined = time.time()
rank = dist.get_rank()
torch.manual_seed(0)
per = int(os.environ.get("MIB", "64")) * (1 << 20) // 4
ckpt = os.path.join(out, "ckpt.pt")
times: dict[str, float] = {}


def restore() -> Any:
    times["began"] = time.time()
    got = worker.load_checkpoint(ckpt)
    times["restored"] = time.time()
    return got


state = restore() if restore_first else None
at = time.time()
if state is not None:  # every parameter comes from the state: no random init to pay for
    module = torch.nn.utils.skip_init(torch.nn.Linear, per // 1024, 1024, bias=False)
else:
    module = torch.nn.Linear(per // 1024, 1024, bias=False)
times["model_s"] = time.time() - at
if state is not None:
    module.load_state_dict(state["model"])
at = time.time()
model = DDP(module, init_sync=state is None)  # the ranks restored the same step: nothing to sync
times["ddp_s"] = time.time() - at
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
if not restore_first:
    state = restore()
    if state is not None:
        model.module.load_state_dict(state["model"])
if state is not None:
    opt.load_state_dict(state["opt"])
times["loaded"] = time.time()
first = worker.resume_step(state)
done: list[float] = []  # when each step of this attempt completed
for step in range(first, steps):
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
    done.append(time.time())
if attempt == 1:  # the first step after the restore, and the next one's time (a step's own cost)
    times |= {"first_step": done[0], "step_s": done[0] - times["loaded"], "next_step_s": done[1] - done[0]}
    with open(os.path.join(out, f"times.{rank}.json"), "w") as f:
        json.dump(times | {"started": started, "joined": joined}, f)
dist.destroy_process_group()
