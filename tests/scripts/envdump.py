"""Write this worker's environment, argv and cwd to $OUT/env.<RANK>.json, then exit."""

import json
import os
import sys

out = os.environ["OUT"]
with open(os.path.join(out, f"env.{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "exe": sys.executable}, f)
print(f"rank {os.environ['RANK']} wrote its environment", flush=True)
