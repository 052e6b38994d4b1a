"""The event history's cost: one append (a read and a transaction) as the history fills up.

It starts a real etcd (``EmbeddedEtcd``, UNIX sockets in a private temp dir) and appends events
through ``EventLog`` as a flood would make them: ``--jobs`` jobs, each event of a random one of
them, until the history is full (``Limits().total`` job events) and beyond. It reports the append
latency (p50 / p99, in the client, one appender) while the history is empty, and once it is full
(every append then moves one event and deletes one), the events kept, and the bytes the history
holds in etcd. Then a read of one job's events and of every event.

    .venv/bin/python bench/bench_events.py [--jobs 1000] [--appends 8000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticd.etcd.client import EtcdClient  # noqa: E402
from elasticd.etcd.embedded import EmbeddedEtcd  # noqa: E402
from elasticd.etcd.keys import Keys  # noqa: E402
from elasticd.history.model import ClusterEvent  # noqa: E402
from elasticd.history.store import EventLog  # noqa: E402


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(1000 * statistics.median(ordered), 2),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
    }


def run(jobs: int, appends: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        etcd = EmbeddedEtcd(Path(tmp) / "etcd")
        etcd.start()
        client = EtcdClient([etcd.endpoint])
        try:
            keys = Keys("/bench/v1")
            log = EventLog(client, keys)
            rng = random.Random(7)
            times: list[float] = []
            for i in range(appends):
                job = f"job-{rng.randrange(jobs)}"
                event = ClusterEvent(
                    time.time(), "round", job, "n1", f"round {i} closed: 8 ranks", {"round": i}
                )
                start = time.perf_counter()
                log.append(event)
                times.append(time.perf_counter() - start)
            stored = client.get_prefix(keys.events())
            t = time.perf_counter()
            one = log.read(job="job-0")
            read_job = time.perf_counter() - t
            t = time.perf_counter()
            every = log.read()
            read_all = time.perf_counter() - t
            full_at = log.limits.total if hasattr(log, "limits") else 1000  # (the single ring: 1000)
            return {
                "jobs": jobs,
                "appends": appends,
                "empty": _ms(times[:500]),
                "full": _ms(times[full_at:]) if appends > full_at else None,
                "kept": len(stored),
                "bytes": sum(len(kv.key) + len(kv.value) for kv in stored),
                "read_one_job_ms": round(1000 * read_job, 1),
                "read_one_job_events": len(one.events),
                "read_all_ms": round(1000 * read_all, 1),
                "read_all_events": len(every.events),
            }
        finally:
            client.close()
            etcd.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--appends", type=int, default=8000)
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args()
    result = run(ns.jobs, ns.appends)
    print(json.dumps(result, indent=2))
    if ns.json is not None:
        ns.json.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
