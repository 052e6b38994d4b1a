"""Elastic jobs make room: how soon a job of a higher priority starts when a running elastic job
lends it a node (``--yield``, the default) against waiting for that job to end (``--no-yield``).

Per trial, on 3 daemons ("nodes", one host) of 2 slots each sharing the bench's etcd: an elastic
``--nnodes 2:3`` job (``examples/elastic_train.py``, 1 rank per node, its LEDGER on) trains at
world 3; then a 1-node job of priority 5 with 2 ranks (it fits nowhere while the elastic job holds
a slot of every node) is submitted, and the elastic job is killed HOLD seconds after that submit:
its bounded length, which is what ``--no-yield`` waits for. The urgent job's workers
(``tests/scripts/member.py``) end as soon as they started. Figures:

- ``to_first_step``: from the urgent job's submit to its workers' start;
- ``lost``: the elastic job's steps its ledger shows twice, or never up to its last one;
- ``steps/s``: the elastic job's throughput over the HOLD seconds, against ``before``, its
  throughput at world 3 just before the submit; ``worlds``: its world sizes, in order.

Variants interleaved; medians.

    python bench/bench_room.py --repeats 2 --hold 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.paths import default_bin
from harness.procs import sweep
from multi.daemon import Daemon, running

from elasticd.etcd.embedded import EmbeddedEtcd

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "elastic_train.py"
MEMBER = REPO / "tests" / "scripts" / "member.py"
ENDED = ("SUCCEEDED", "FAILED", "KILLED")


def wait(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s}s")
        time.sleep(0.05)


def submit(d: Daemon, *argv: str) -> str:
    res = d.ctl("submit", "--python", sys.executable, *argv, timeout_s=60)
    if res.returncode != 0:
        raise RuntimeError(f"submit: {res.stdout} {res.stderr}")
    return res.stdout.splitlines()[0].strip()


def ledger(book: Path) -> list[tuple[int, int]]:
    """The elastic job's completed steps, each with its world size (rank 0 writes them)."""
    if not book.exists():
        return []
    return [(int(s), int(w)) for s, w in (line.split() for line in book.read_text().splitlines() if line)]


def lost(entries: list[tuple[int, int]]) -> int:
    """Steps done twice (a restart from an older checkpoint) or never, up to the last one."""
    steps = [s for s, _ in entries]
    done = set(steps)
    return (len(steps) - len(done)) + ((max(done) + 1 - len(done)) if done else 0)


def worlds(entries: list[tuple[int, int]]) -> str:
    return ",".join(str(w) for i, (_, w) in enumerate(entries) if i == 0 or entries[i - 1][1] != w)


def at_world_3(book: Path) -> float:
    """Once the elastic job trains at world 3: its steps a second there, over 5 s."""
    wait(lambda: any(w == 3 for _, w in ledger(book)[-3:]), 180, "the elastic job at world 3")
    p0, t0 = len(ledger(book)), time.monotonic()
    time.sleep(5)
    return (len(ledger(book)) - p0) / (time.monotonic() - t0)


def trial(daemons: list[Daemon], out: Path, yields: bool, hold_s: float) -> dict[str, float | str]:
    """One episode (module doc)."""
    out.mkdir()
    d, book = daemons[0], out / "ledger"
    train = ["--steps", "1000000", "--checkpoint", str(out / "ckpt.pt"), "--every", "100000"]
    flags = [
        "--nnodes",
        "2:3",
        "--last-call",
        "1",
        "--env",
        f"LEDGER={book}",
        *([] if yields else ["--no-yield"]),
    ]
    elastic = submit(d, *flags, str(TRAIN), "--", *train, "--step-time", "0.05")
    before = at_world_3(book)
    p0, t0 = len(ledger(book)), time.monotonic()
    urgent = submit(d, "--priority", "5", "--nproc-per-node", "2", "--env", f"OUT={out}", str(MEMBER))
    first: float | None = None
    while (now := time.monotonic()) < t0 + hold_s:
        if first is None and len(list(out.glob("w.0.*.json"))) == 2:
            first = now - t0
            (out / "finish").touch()  # the urgent job ends: the elastic job may grow back
        time.sleep(0.02)
    steps = len(ledger(book)) - p0
    d.ctl("kill", elastic)
    if first is None:
        wait(lambda: len(list(out.glob("w.0.*.json"))) == 2, 120, "the urgent job to start")
        first = time.monotonic() - t0
        (out / "finish").touch()
    for job in (urgent, elastic):
        wait(lambda j=job: d.status(j).get("state") in ENDED, 120, f"{job} to end")  # type: ignore[misc]
    entries = ledger(book)
    return {"to_first_step": first, "lost": lost(entries), "steps/s": steps / hold_s, "before": before,
            "worlds": worlds(entries)}  # fmt: skip


def run(
    repeats: int, hold_s: float, tmp: Path, binary: Path, etcd: str
) -> dict[str, list[dict[str, float | str]]]:
    env = {"PATH": f"{binary}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    nodes = [
        Daemon(binary, env, etcd, tmp / f"n{i}", f"room-{i}", "/bench/room", ("--slots", "2"))
        for i in range(3)
    ]
    found: dict[str, list[dict[str, float | str]]] = {"yield": [], "no-yield": []}
    with running(nodes) as daemons:
        for i in range(repeats):
            for variant in found:
                got = trial(daemons, tmp / f"{variant}-{i}", variant == "yield", hold_s)
                print(f"  {variant:>8} #{i}: {got}", flush=True)
                found[variant].append(got)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--hold", type=float, default=40.0, help="seconds from the urgent submit to the elastic job's end"
    )
    ap.add_argument("--bin", default=str(default_bin()))
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-room-"))
    etcd = EmbeddedEtcd(tmp / "etcd")
    etcd.start()
    try:
        found = run(ns.repeats, ns.hold, tmp, Path(ns.bin), etcd.endpoint)
    finally:
        etcd.stop()
        sweep([str(tmp)])
    print(
        f"{'variant':>8} {'to_first_step':>13} {'lost':>5} {'steps/s':>8} {'before':>7}  worlds   (medians)"
    )
    for variant, got in found.items():
        med = {
            k: statistics.median(float(g[k]) for g in got)
            for k in ("to_first_step", "lost", "steps/s", "before")
        }
        print(f"{variant:>8} {med['to_first_step']:>13.1f} {med['lost']:>5.0f} {med['steps/s']:>8.1f} "
              f"{med['before']:>7.1f}  {' | '.join(str(g['worlds']) for g in got)}")  # fmt: skip


if __name__ == "__main__":
    main()
