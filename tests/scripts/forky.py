"""A worker that forks: a child in its group, and a grandchild that escapes into a new session."""

import os
import subprocess
import sys
import time

out = os.environ["OUT"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
escapee = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.path.join(out, f"pids.{os.environ['RANK']}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid} {escapee.pid}")
time.sleep(600)
