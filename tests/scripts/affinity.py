"""Write the CPUs this worker may run on to $OUT/aff.<rank>.json, then exit 0."""

import json
import os

path = os.path.join(os.environ["OUT"], f"aff.{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "threads": os.cpu_count()}, f)
os.replace(path + ".tmp", path)
