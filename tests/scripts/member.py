"""Record what this worker was told, then run until $OUT/finish exists (or $FAIL_ROUND says fail).

Writes $OUT/w.<round>.<rank>.json (env subset, pid, node) at start. With FAIL_ON_ROUND=R every
worker of round R exits 1 after FAIL_AFTER seconds (to make concurrent failures on all nodes).
"""

import json
import os
import sys
import time

out = os.environ["OUT"]
keys = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "ELASTICD_ROUND",
    "ELASTICD_OWNER",
    "CUDA_VISIBLE_DEVICES",
]
record = {k: os.environ.get(k) for k in keys} | {"pid": os.getpid(), "started": time.time()}
path = os.path.join(out, f"w.{os.environ['ELASTICD_ROUND']}.{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if os.environ.get("FAIL_ON_ROUND") == os.environ["ELASTICD_ROUND"]:
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.5")))
    sys.exit(1)
while not os.path.exists(os.path.join(out, "finish")):
    time.sleep(0.05)
