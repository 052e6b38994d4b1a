"""The daemon's way of starting a child (a fork with ``worker_preexec``, then exec) while the grpc
client is busy, as it always is in a daemon: watches open, and threads calling into grpc.
Prints how many of the children died of a signal before their exec.

Usage: python grpc_forks.py ENDPOINT COUNT (a fresh interpreter: grpc reads its settings once).
"""

import json
import subprocess
import sys
import threading

from elasticd.etcd.backend import connect
from elasticd.workers.proctree.spawn import worker_preexec

endpoint, count = sys.argv[1], int(sys.argv[2])
kv = connect("grpc", [endpoint])
cancels = [kv.watch_prefix(f"/grpc-forks/{i}/", lambda key, deleted: None, lambda: None) for i in range(3)]
done = threading.Event()


def churn() -> None:
    while not done.is_set():
        kv.put_json("/grpc-forks/0/x", {"n": 1})
        kv.get_prefix("/grpc-forks/1/")


threads = [threading.Thread(target=churn) for _ in range(2)]
for t in threads:
    t.start()
codes = [
    subprocess.run(["/bin/true"], preexec_fn=worker_preexec("/", None), stderr=subprocess.DEVNULL).returncode
    for _ in range(count)
]
done.set()
for t in threads:
    t.join()
for cancel in cancels:
    cancel()
kv.close()
print(json.dumps({"signalled": sum(c < 0 for c in codes), "failed": sum(c != 0 for c in codes)}))
