"""Reports a step every STEP_S seconds (rank 1 every SLOW_S: a straggler) until $OUT/stop exists."""

import os
import time

from elasticd import worker

rank = int(os.environ["RANK"])
pause = float(os.environ.get("SLOW_S", "0.3")) if rank == 1 else float(os.environ.get("STEP_S", "0.05"))
stop = os.path.join(os.environ["OUT"], "stop")
step = 0
while not os.path.exists(stop):
    time.sleep(pause)
    worker.step(step)
    step += 1
print(f"rank {rank} stopped after {step} steps", flush=True)
