"""A job whose every loss is known from its own stamps (tests/integration/test_goodput.py).

Each launch appends to $OUT/stamps one line per event, ``launch kind step time`` (``time.time()``
right after the report it stamps), and picks up from $OUT/saved (the last step saved):

- launch 0: steps 1..10; after step 5 a checkpoint (the phase, STEP_S * 8) that saves step 5;
  after step 10, a crash in the middle of a step (exit 1): steps 6..10 are lost;
- launch 1: steps 6..20 (6..10 again), saving each from 11 on; then stops reporting (a hang);
- launch 2: steps 21.. saving each, until the node is drained (SIGTERM);
- launch 3: LAST more steps, then exit 0.
"""

import os
import sys
import time
from pathlib import Path

from elasticd import worker

STEP_S = float(os.environ.get("STEP_S", "0.25"))
LAST = int(os.environ.get("LAST", "40"))
out = Path(os.environ["OUT"])
stamps_path, saved_path = out / "stamps", out / "saved"
before = stamps_path.read_text().splitlines() if stamps_path.exists() else []
launch = sum(1 for line in before if " start " in line)
stamps = open(stamps_path, "a", buffering=1)  # noqa: SIM115 (held to the end)


def stamp(kind: str, step: int = 0) -> None:
    stamps.write(f"{launch} {kind} {step} {time.time():.6f}\n")


def run_step(n: int, save: bool) -> None:
    time.sleep(STEP_S)
    if save:
        saved_path.write_text(str(n))
    worker.step(n)
    stamp("step", n)


stamp("start")
first = int(saved_path.read_text()) + 1 if saved_path.exists() else 1
if launch == 0:
    for n in range(1, 11):
        run_step(n, False)
        if n == 5:
            stamp("ckpt_begin", n)
            with worker.checkpointing():
                time.sleep(STEP_S * 8)
                saved_path.write_text(str(n))
            stamp("ckpt_end", n)
    time.sleep(STEP_S * 3)  # the step in flight, lost
    os._exit(1)
if launch == 1:
    for n in range(first, 21):
        run_step(n, n > 10)
    stamp("hang", 20)
    time.sleep(10**6)
if launch == 2:
    n = first
    while True:  # until the drain's SIGTERM
        run_step(n, True)
        n += 1
for n in range(first, first + LAST):
    run_step(n, True)
sys.exit(0)
