"""A worker SIGKILLed, and the first step after its state is restored from memory (one daemon,
2 ranks, a snapshot after every step).

Each trial submits ``snapshot_restart_worker.py`` (a DDP model of ``--mib`` MiB, SGD without
momentum) to a real daemon with its defaults (memory snapshots on, their bound derived from the
host; warm workers; ``--snapshot-bytes`` sets a bound instead); rank 1 kills itself at the start of
a step, the daemon restarts the group, both ranks restore the newest snapshot and train on.
Reported per trial and as medians, from rank 1's SIGKILL (its wall time, written just before):

- ``to_start``: until the later rank's script runs again (the restart: the failure seen, the group
  stopped, the workers forked from the zygote, the script's own imports);
- ``pg_init``: the script's ``init_process_group`` (the rendezvous on the master's store, gloo's
  connections);
- ``model``, ``ddp``: building the model and wrapping it in DDP (with ``--order build-first``, the
  model's random init and DDP's broadcast of it; restore-first skips both when a state was restored);
- ``restore``: the later rank's ``load_checkpoint`` (the ranks' agreement, the mapping);
- ``to_loaded``: until the later rank had loaded the state (model and optimizer);
- ``to_first_step``: until the later rank finished its first step after the restore;
- ``step``, ``next_step``: that first step's own time, and the next one's (a step's cost: a
  forward, a backward with its all-reduce, SGD, a snapshot).

And the daemon's side, from its log, each from the SIGKILL: ``seen`` (``worker.exited`` of rank 1),
``stopped`` (``group.stopped``: a settle window, if any, and the survivor's stop), ``spawned``
(``group.spawned``: the new group forked).

    python bench/bench_snapshot_restart.py --trials 5 --mib 64
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import DaemonProc, EtcdServer, log_events, unique  # noqa: E402

WORKER = REPO / "bench" / "snapshot_restart_worker.py"
# what torch imports on first use, in each new worker unless its zygote has: DDP's constructor
# (torch._dynamo, ~1 s), a module built on the meta device (skip_init: sympy, ~0.4 s)
LAZY = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes")


def trial(daemon: DaemonProc, out: Path, mib: int, order: str, preload: list[str]) -> dict[str, float]:
    out.mkdir()
    env = dict(os.environ, OUT=str(out), MIB=str(mib), ORDER=order, ELASTICD_SNAPSHOT_PERSIST_EVERY="0")
    argv = ["submit", "--nproc-per-node", "2", "--max-restarts", "1", "--follow"]
    argv += [f"--preload={mod}" for mod in preload] + [str(WORKER)]
    res = daemon.ctl(*argv, env=env, timeout_s=300)
    if res.returncode != 0:
        raise SystemExit(f"trial failed: {res.stdout}{res.stderr}")
    killed = float((out / "killed").read_text())
    times = [json.loads((out / f"times.{r}.json").read_text()) for r in (0, 1)]
    return daemon_side(daemon, res.stdout.splitlines()[0], killed) | {
        "to_start": max(t["started"] for t in times) - killed,
        "pg_init": max(t["joined"] - t["started"] for t in times),
        "model": max(t["model_s"] for t in times),
        "ddp": max(t["ddp_s"] for t in times),
        "restore": max(t["restored"] - t["began"] for t in times),
        "to_loaded": max(t["loaded"] for t in times) - killed,
        "to_first_step": max(t["first_step"] for t in times) - killed,
        "step": max(t["step_s"] for t in times),
        "next_step": max(t["next_step_s"] for t in times),
    }


def _at(event: dict[str, object]) -> float:
    stamp = str(event["timestamp"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def daemon_side(daemon: DaemonProc, job: str, killed: float) -> dict[str, float]:
    """When the daemon saw the kill, stopped the group and forked the next, from its log."""
    exited = [
        e for e in log_events(daemon, "worker.exited") if _at(e) >= killed and e.get("returncode") == -9
    ]
    stopped = [e for e in log_events(daemon, "group.stopped", job=job) if _at(e) >= killed]
    spawned = [e for e in log_events(daemon, "group.spawned", job=job) if _at(e) >= killed]
    if not (exited and stopped and spawned):
        return {}
    return {
        "seen": _at(exited[0]) - killed,
        "stopped": _at(stopped[0]) - killed,
        "spawned": _at(spawned[0]) - killed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--order", choices=("restore-first", "build-first"), default="restore-first")
    parser.add_argument(
        "--preload",
        action="append",
        default=None,
        help="a module the job's zygote imports (default: what DDP and skip_init import on first use)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the daemon's and the workers' logs")
    parser.add_argument(
        "--snapshot-bytes",
        type=int,
        default=None,
        help="the daemon's snapshot_bytes (default: unset, the bound it derives from this host)",
    )
    args = parser.parse_args()
    if args.preload is None:
        args.preload = list(LAZY)
    args.preload = [m for m in args.preload if m]  # --preload '' : none
    # the job runs the submitter's `python`: this one (torch, this checkout), as in the tests
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with contextlib.ExitStack() as stack:
        tmp = tempfile.mkdtemp() if args.keep else stack.enter_context(tempfile.TemporaryDirectory())
        root = Path(tmp)
        etcd = EtcdServer(root / "etcd")
        etcd.start()
        flags = ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", f"/b/{unique('p')}", "--slots", "2"]
        flags += ["--address", "127.0.0.1"]
        if args.snapshot_bytes is not None:
            flags += ["--snapshot-bytes", str(args.snapshot_bytes)]
        daemon = DaemonProc(unique("bench"), root / "node", flags, dict(os.environ))
        daemon.start()
        try:
            rows = [
                trial(daemon, root / f"t{i}", args.mib, args.order, args.preload) for i in range(args.trials)
            ]
        finally:
            daemon.stop()
            etcd.stop()
    if args.keep:
        print(f"logs kept in {root}")
    for i, row in enumerate(rows):
        print(f"trial {i}: " + "  ".join(f"{k} {v:.3f} s" for k, v in row.items()))
    med = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}
    print(
        json.dumps(
            {
                "mib": args.mib,
                "order": args.order,
                "preload": args.preload,
                "trials": args.trials,
                "median_s": med,
                "load_avg": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
