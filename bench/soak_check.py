"""The soak's end checks: the committed ledger, the crash-loss bound, orphans, leaked etcd keys,
the etcd client the daemons ran on.

Each check is a ``Check`` (name, ok, detail); the soak passes only when every one holds.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from harness.procs import own_processes
from soak_cluster import Cluster, LifeLine, Step, wait_until

from elasticd.decode import DecodeError
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.workers.proctree import markers
from elasticd.workers.proctree import tree as proctree


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def load_ledger(ckpt: Path) -> dict[str, Any] | None:
    """The committed checkpoint (torch is imported here only: the soak itself does not need it)."""
    if not ckpt.exists():
        return None
    import torch

    return dict(torch.load(ckpt, map_location="cpu", weights_only=False))


def check_ledger(ckpt: Path, target: int) -> Check:
    state = load_ledger(ckpt)
    if state is None:
        return Check("ledger", False, "no checkpoint")
    steps = [int(e[0]) for e in state["ledger"]]
    final = int(state["step"])
    dups = len(steps) - len(set(steps))
    missing = sorted(set(range(final)) - set(steps))
    ok = steps == list(range(final)) and bool(state.get("finished")) and final >= target
    detail = (
        f"{len(steps)} steps committed, final step {final} (asked {target}), "
        f"finished={state.get('finished')}, "
        f"duplicates={dups}, missing={len(missing)}{' e.g. ' + str(missing[:5]) if missing else ''}"
        f"{'' if steps == sorted(steps) else ', out of order'}"
    )
    return Check("ledger: no gap, no duplicate", ok, detail)


def rollbacks(steps: list[Step]) -> list[tuple[int, int]]:
    """(last step reported, step resumed at) for every time the progress log went back or skipped."""
    out = []
    for prev, cur in itertools.pairwise(steps):
        if cur.step != prev.step + 1:
            out.append((prev.step, cur.step))
    return out


def check_crash_loss(steps: list[Step], every: int) -> Check:
    """Each rollback redoes at most ``every`` steps (the commit interval: the disk checkpoint's, or
    1 with a memory snapshot after every step); none skips ahead."""
    backs = rollbacks(steps)
    redone = [last - resumed + 1 for last, resumed in backs]
    skipped = [(a, b) for a, b in backs if b > a + 1]
    too_many = [r for r in redone if r > every]
    ok = not skipped and not too_many
    detail = (
        f"{len(backs)} resumptions, {sum(r for r in redone if r > 0)} steps redone "
        f"(max {max(redone, default=0)} per crash, bound {every}; "
        f"{sum(r == 1 for r in redone)} redid 1 step, {sum(r > 1 for r in redone)} more)"
        + (f", skipped ahead: {skipped[:5]}" if skipped else "")
    )
    return Check("crash loss within the contract", ok, detail)


def round_spans(lives: list[LifeLine]) -> dict[int, tuple[float, float]]:
    """Each round's (first, last) line over all its workers: when it had live workers."""
    spans: dict[int, tuple[float, float]] = {}
    for life in lives:
        first, last = spans.get(life.round, (life.at, life.at))
        spans[life.round] = (min(first, life.at), max(last, life.at))
    return spans


def check_rounds_disjoint(lives: list[LifeLine]) -> Check:
    """No two rounds had live workers at once, from the workers' own life lines (not from etcd).

    A worker writes a line when it starts and every 0.1 s until it dies, so a round's span runs
    from its first worker's start to (within 0.1 s of) its last worker's death. Every later
    round must start after every earlier round's span ended. An overlap shorter than the beat
    (0.1 s) can go unseen; the smallest gap found is reported.
    """
    spans = sorted(round_spans(lives).items())
    overlaps = []
    gaps = []
    ended_by, ended_round = float("-inf"), -1
    for rnd, (first, last) in spans:
        if first <= ended_by:
            overlaps.append(f"round {rnd} started {ended_by - first:.2f}s before round {ended_round} ended")
        elif ended_round >= 0:
            gaps.append(first - ended_by)
        if last > ended_by:
            ended_by, ended_round = last, rnd
    detail = f"{len(spans)} rounds, {len({life.pid for life in lives})} workers; " + (
        f"overlaps: {overlaps[:5]}" if overlaps else f"smallest gap {min(gaps, default=0.0):.2f}s"
    )
    return Check("never two rounds with live workers at once", not overlaps and bool(spans), detail)


def check_fencing(results: list[Any]) -> Check:
    """Every fault that took a node off etcd had the node's workers dead within TTL + 1 s."""
    fencing = [r for r in results if r.fence_bound_s is not None]
    late = [
        f"#{r.fault.index} {r.fault.kind}: {r.fenced_s}s" for r in fencing
        if r.fenced_s is None or r.fenced_s > r.fence_bound_s
    ]  # fmt: skip
    times = [r.fenced_s for r in fencing if r.fenced_s is not None]
    detail = (
        f"{len(fencing)} cuts, fenced in {min(times, default=0):.2f}-{max(times, default=0):.2f}s"
        f" (bound {fencing[0].fence_bound_s if fencing else '-'}s)"
        + (f"; late or never: {late}" if late else "")
    )
    return Check("cut nodes fenced within TTL + 1 s", not late, detail)


def job_processes(job_id: str) -> list[psutil.Process]:
    """Every process carrying the job's marker, whichever node started it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(markers.JOB_ENV) == job_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def check_job_orphans(job_id: str, timeout_s: float = 30.0) -> Check:
    """After the end: no worker of the job is left (waits for the last exits, then looks)."""
    wait_until(lambda: not job_processes(job_id), timeout_s, 0.2)
    left = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in job_processes(job_id)]
    return Check("no orphan worker after the end", not left, "; ".join(left) or "none")


def check_own_orphans(c: Cluster, timeout_s: float = 15.0) -> Check:
    """After the shutdown: nothing the soak started (daemons, reapers, etcd, workers) still runs."""

    def leftovers() -> list[str]:
        procs = [f"{pid} {cmd[:100]}" for pid, cmd in own_processes(c.markers())]
        for node in c.node_ids:
            procs += [f"{p.pid} (marked {node})" for p in proctree.marked(node)]
        return procs

    wait_until(lambda: not leftovers(), timeout_s, 0.2)
    left = leftovers()
    return Check("no orphan process after the shutdown", not left, "; ".join(left) or "none")


def check_etcd_client(c: Cluster) -> Check:
    """Every daemon start talked to etcd through the client the soak asked for (``--etcd-client``;
    mixed: each daemon's own): each daemon's log has its ``etcd.connected`` events, and every one
    names that client."""
    seen: dict[str, list[str]] = {}
    for d in c.daemons:
        seen[d.node_id] = [str(e.get("client")) for e in d.events("etcd.connected")]
    wrong = {d.node_id: seen[d.node_id] for d in c.daemons if set(seen[d.node_id]) != {d.etcd_client}}
    starts = sum(len(v) for v in seen.values())
    detail = f"wrong or none: {wrong}" if wrong else f"{starts} daemon starts on {c.etcd_client}"
    return Check(f"every daemon on the {c.etcd_client} etcd client", not wrong, detail)


# A round's records, kept for the last two rounds (the previous one's members give stable ranks).
_ROUND_KINDS = (KeyKind.RESULT, KeyKind.ASSIGNMENT, KeyKind.DONE, KeyKind.LEFT, KeyKind.JOIN, KeyKind.LEAD)


def allowed_key(keys: Keys, key: str, job_id: str, last_round: int, live_nodes: set[str]) -> bool:
    """Whether ``key`` may outlive the job: its history (head and spec, round, restarts, final, the last two
    rounds' records) and the live daemons' own records."""
    try:
        ref = keys.parse(key)
    except DecodeError:
        return False
    if ref.kind is KeyKind.NODE:
        return ref.node in live_nodes
    if ref.kind in (KeyKind.JANITOR, KeyKind.EVENT, KeyKind.EVENT_SEQ):
        return True  # the cluster's event history is bounded by construction (elasticd.history)
    if ref.job != job_id:
        return False
    if ref.kind in (KeyKind.SPEC, KeyKind.BODY, KeyKind.ROUND, KeyKind.RESTARTS, KeyKind.FINAL):
        return True
    if ref.kind in _ROUND_KINDS:
        return ref.round is not None and last_round - 1 <= ref.round <= last_round
    if ref.kind is KeyKind.NODE_STATUS:
        return ref.node in live_nodes
    return False  # waiting, pending, job drain, node drain: nothing to keep once the job ended


def check_keys(c: Cluster, timeout_s: float = 30.0) -> Check:
    """The keys under the prefix, once the job ended, are the job's history and live nodes only."""
    keys = Keys(c.prefix)
    live = {c.node_ids[i] for i in range(len(c.daemons)) if c.running(i)}
    round_key = keys.job_round(c.job_id)

    def leaked() -> list[str]:
        found = c.etcd_keys()
        last = _round(c, round_key)
        return [k for k in found if not allowed_key(keys, k, c.job_id, last, live)]

    wait_until(lambda: not leaked(), timeout_s, 0.5)  # agents may still be tidying up
    extra = leaked()
    return Check(
        "no leaked etcd key",
        not extra,
        f"{len(c.etcd_keys())} keys; leaked: {[keys.relative(k) for k in extra]}"
        if extra
        else f"{len(c.etcd_keys())} keys",
    )


def _round(c: Cluster, round_key: str) -> int:
    from elasticd.etcd.client import EtcdClient

    client = EtcdClient([c.etcd.endpoint], c.etcd.client_auth(), timeout_s=5)
    try:
        kv = client.get(round_key)
        return int(json.loads(kv.value)["round"]) if kv is not None else -1
    finally:
        client.close()
