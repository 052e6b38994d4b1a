"""A worker SIGKILLed, and the first step after its state is restored from memory (one daemon,
2 ranks, a snapshot after every step).

Each trial submits ``snapshot_restart_worker.py`` (a DDP model of ``--mib`` MiB, SGD without
momentum) to a real daemon with memory snapshots on (and its default warm workers); rank 1 kills
itself at the start of a step, the daemon restarts the group, both ranks restore the newest
snapshot and train on. Reported per trial and as medians, from rank 1's SIGKILL (its wall time,
written just before):

- ``to_start``: until the later rank's script runs again (the restart: the failure seen, the group
  stopped, the workers forked from the zygote, the script's own imports);
- ``setup``: the script's ``init_process_group``, model and DDP (a broadcast of the model);
- ``to_restore``: until the later rank's ``load_checkpoint`` began;
- ``restore``: the later rank's ``load_checkpoint`` (the ranks' agreement, the mapping);
- ``load_state``: ``load_state_dict`` of model and optimizer (the copy out of the snapshot);
- ``to_first_step``: until the later rank finished its first step after the restore.

    python bench/bench_snapshot_restart.py --trials 5 --mib 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import DaemonProc, EtcdServer, unique  # noqa: E402

WORKER = REPO / "bench" / "snapshot_restart_worker.py"


def trial(daemon: DaemonProc, out: Path, mib: int) -> dict[str, float]:
    out.mkdir()
    env = dict(os.environ, OUT=str(out), MIB=str(mib), ELASTICD_SNAPSHOT_PERSIST_EVERY="0")
    argv = ["submit", "--nproc-per-node", "2", "--max-restarts", "1", "--follow", str(WORKER)]
    res = daemon.ctl(*argv, env=env, timeout_s=300)
    if res.returncode != 0:
        raise SystemExit(f"trial failed: {res.stdout}{res.stderr}")
    killed = float((out / "killed").read_text())
    times = [json.loads((out / f"times.{r}.json").read_text()) for r in (0, 1)]
    return {
        "to_start": max(t["started"] for t in times) - killed,
        "setup": max(t["began"] - t["started"] for t in times),
        "to_restore": max(t["began"] for t in times) - killed,
        "restore": max(t["restored"] - t["began"] for t in times),
        "load_state": max(t["loaded"] - t["restored"] for t in times),
        "to_first_step": max(t["first_step"] for t in times) - killed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    # the job runs the submitter's `python`: this one (torch, this checkout), as in the tests
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root / "etcd")
        etcd.start()
        flags = ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", f"/b/{unique('p')}", "--slots", "2"]
        flags += ["--snapshot-bytes", str((2 * 3 * 2 * args.mib + 64) << 20), "--address", "127.0.0.1"]
        daemon = DaemonProc(unique("bench"), root / "node", flags, dict(os.environ))
        daemon.start()
        try:
            rows = [trial(daemon, root / f"t{i}", args.mib) for i in range(args.trials)]
        finally:
            daemon.stop()
            etcd.stop()
    for i, row in enumerate(rows):
        print(f"trial {i}: " + "  ".join(f"{k} {v:.3f} s" for k, v in row.items()))
    med = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}
    print(
        json.dumps({"mib": args.mib, "trials": args.trials, "median_s": med, "load_avg": os.getloadavg()[0]})
    )


if __name__ == "__main__":
    main()
