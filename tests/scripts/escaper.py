"""A worker that leaves a process behind, escaped from everything but its cgroup.

It double-forks (sh backgrounds ``sleep`` and exits, so ``sleep``'s parent is gone), in a new
session (``setsid``: a process group of its own) with an empty environment (``env -i``: no
ELASTICD_* marker). It writes ``escapee.<attempt>.<rank>`` (the escapee's pid, then the worker's),
then by MODE: ``exit`` exits 0, ``fail-first`` exits 1 in attempt 0 (and sleeps later), else sleeps.
"""

import os
import subprocess
import sys
import time

attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
final = os.path.join(os.environ["OUT"], f"escapee.{attempt}.{rank}")
partial = final + ".tmp"
shell = f"/bin/sleep 1000 & echo $! > {partial}"
subprocess.run(["/usr/bin/env", "-i", "/usr/bin/setsid", "/bin/sh", "-c", shell], check=True)
with open(partial) as f:
    escapee = f.read().strip()
with open(partial, "w") as f:
    f.write(f"{escapee} {os.getpid()}\n")
os.rename(partial, final)
mode = os.environ.get("MODE", "sleep")
if mode == "exit":
    sys.exit(0)
if mode == "fail-first" and attempt == "0":
    sys.exit(1)
time.sleep(1000)
