"""Roles by group rank, for the root cause across nodes (no torch).

Group 1's first rank crashes when $OUT/go appears, writing torch's error file (``@record``'s
format, whole-second timestamp); group 1's other rank keeps running. Group 0's ranks fail
1.5 s after the crash, without an error file, as ranks broken by a peer's crash do.
"""

import json
import os
import sys
import time
from pathlib import Path

out = Path(os.environ["OUT"])
rank, group, local = int(os.environ["RANK"]), int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
(out / f"started.{rank}").write_text(str(os.getpid()))


def wait(path: Path) -> None:
    while not path.exists():
        time.sleep(0.02)


wait(out / "go")
if group == 1 and local == 0:
    message = {"message": "RuntimeError: the real crash", "extraInfo": {"timestamp": str(int(time.time()))}}
    Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text(json.dumps({"message": message}))
    (out / "crashed").write_text("")
    sys.exit(1)
if group == 1:
    time.sleep(3600)  # keeps its node settling: the crash is not reported at once
wait(out / "crashed")
time.sleep(1.5)
print(f"rank {rank}: Connection closed by peer", flush=True)
sys.exit(1)
