"""Sleep for $SLEEP seconds (default 600), then exit 0."""

import os
import time

print(f"rank {os.environ['RANK']} devices={os.environ.get('CUDA_VISIBLE_DEVICES')!r}", flush=True)
time.sleep(float(os.environ.get("SLEEP", "600")))
