"""Write the CPUs this worker may run on, and its memory policy (read by itself, in its main
thread and in a thread it starts), to $OUT/aff.<rank>.json, then exit 0."""

import ctypes
import json
import os
import threading
from typing import Any

# get_mempolicy(2) by uname -m (glibc has no wrapper): this script checks elasticd, so it does not
# import elasticd's own table.
GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}


def policy() -> list[Any] | str:
    """[mode, [nodes]] of the calling thread, or the errno as a string."""
    number = GET_MEMPOLICY.get(os.uname().machine)
    if number is None:
        return "ENOSYS"
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * (4096 // bits))()
    mode = ctypes.c_int(-1)
    libc = ctypes.CDLL(None, use_errno=True)
    size, flags = ctypes.c_ulong(4096), ctypes.c_ulong(0)
    if libc.syscall(ctypes.c_long(number), ctypes.byref(mode), mask, size, None, flags) != 0:
        return str(ctypes.get_errno())
    return [mode.value, [i * bits + b for i, w in enumerate(mask) for b in range(bits) if w >> b & 1]]


seen: list[list[Any] | str] = []
thread = threading.Thread(target=lambda: seen.append(policy()))
thread.start()
thread.join()
path = os.path.join(os.environ["OUT"], f"aff.{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "threads": os.cpu_count(), "policy": policy(),
               "thread_policy": seen[0]}, f)  # fmt: skip
os.replace(path + ".tmp", path)
