"""Rank $FAIL_RANK fails on every attempt (exit $FAIL_CODE, or a signal if $FAIL_SIGNAL); others sleep."""

import os
import signal
import sys
import time

rank = os.environ["RANK"]
print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} rank {rank} pid {os.getpid()}", flush=True)
with open(
    os.path.join(os.environ["OUT"], f"attempt.{os.environ['TORCHELASTIC_RESTART_COUNT']}.{rank}"), "w"
) as f:
    f.write(str(os.getpid()))
if rank == os.environ.get("FAIL_RANK", "1"):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.3")))
    print("something went wrong in rank", rank, file=sys.stderr, flush=True)
    if os.environ.get("FAIL_SIGNAL"):
        os.kill(os.getpid(), getattr(signal, os.environ["FAIL_SIGNAL"]))
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
time.sleep(600)
