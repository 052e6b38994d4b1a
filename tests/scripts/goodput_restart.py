"""A job whose node's daemon is killed while it runs (tests/integration/test_goodput.py).

Each launch appends to $OUT/stamps one line per event, ``launch kind step time`` (``time.time()``
right after the report it stamps), and picks up from $OUT/saved (saved at every step):

- launch 0: steps from 1 on, until the daemon's SIGKILL takes the workers down;
- launch 1: LAST more steps, then exit 0.
"""

import os
import sys
import time
from pathlib import Path

from elasticd import worker

STEP_S = float(os.environ.get("STEP_S", "0.2"))
LAST = int(os.environ.get("LAST", "40"))
out = Path(os.environ["OUT"])
stamps_path, saved_path = out / "stamps", out / "saved"
before = stamps_path.read_text().splitlines() if stamps_path.exists() else []
launch = sum(1 for line in before if " start " in line)
stamps = open(stamps_path, "a", buffering=1)  # noqa: SIM115 (held to the end)
stamps.write(f"{launch} start 0 {time.time():.6f}\n")
n = int(saved_path.read_text()) + 1 if saved_path.exists() else 1
end = None if launch == 0 else n + LAST  # the first launch runs until its daemon is killed
while end is None or n < end:
    time.sleep(STEP_S)
    saved_path.write_text(str(n))
    worker.step(n)
    stamps.write(f"{launch} step {n} {time.time():.6f}\n")
    n += 1
sys.exit(0)
