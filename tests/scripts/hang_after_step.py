"""Reports steps through elasticd.worker, then (in the first attempt only) hangs in ``stuck``:
a sleep that never ends, as a dead-locked data loader or a lost peer would look."""

import os
import time

from elasticd import worker


def stuck() -> None:
    time.sleep(10**6)  # HANG LINE


for step in range(3):
    worker.step(step)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    print("reported 3 steps; hanging now", flush=True)
    stuck()
print("second attempt: done", flush=True)
