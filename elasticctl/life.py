"""A followed job's life, told once per change: pending and why, each round that closes (its world),
each round that opens (why: a failure, a lost node, a scale-up, a node that left or was drained).

Pure: ``Life.update`` takes the job as every ``logs`` reply carries it (``JobView``) with its current
round (``RoundView``) and returns what to say, each with the time it happened (the records' own
times where they have one, else when it was seen). It decides on fields and codes, never on text.
Every round waits a moment for its nodes to join: a wait for nodes is told once it lasts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from elasticd.terms.state import exit_text
from elasticd.wire import JobState, RoundView, WaitsFor

# RoundView.reason: why a round was opened (``elasticd.rendezvous.model.RoundReason``)
WHY = {
    "start": "started",
    "worker_failed": "a worker failed",
    "member_lost": "a node was lost",
    "scale_up": "scaling up",
    "member_left": "a node left (drained or stopped)",
    "gpu_failed": "a GPU went unhealthy",
}
QUIET_S = 2.0  # a wait for nodes is told once it lasts this long: every round's joins take a moment
WAITS = {WaitsFor.CAPACITY: "waits for free slots", WaitsFor.NODES: "waits for nodes"}


def hhmmss(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _ranks(member: Mapping[str, Any]) -> str:
    lo, hi = member["ranks"]
    return f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"


def _failure(view: Mapping[str, Any]) -> str:
    f = view.get("failure")
    if not f:
        return ""
    what = exit_text(f.get("exit_code"), f.get("signal"), f.get("message", ""))
    return f"rank {f['rank']} (local {f['local_rank']} on {f['node']}) failed with {what}"


class Life:
    """What has been said of one job; ``update`` says what is new."""

    def __init__(self) -> None:
        self._said: set[tuple[Any, ...]] = set()
        self._waiting: dict[tuple[Any, ...], float] = {}  # waits, and when first seen

    def _once(self, key: tuple[Any, ...], at: float, text: str, out: list[tuple[float, str]]) -> None:
        if key not in self._said:
            self._said.add(key)
            out.append((at, text))

    def update(self, view: Mapping[str, Any], info: RoundView | None, now: float) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        if view.get("stale"):  # a node's own view while etcd is unreachable: not the job's
            return out
        try:
            state = JobState(str(view.get("state")))
        except ValueError:
            return out
        rnd = int(view.get("round") or 0)
        current = info if info is not None and info["round"] == rnd else None
        if current is not None and rnd > 0:
            self._once(("opened", rnd), current["opened_at"], self._opened(current, view), out)
        waits = view.get("waits_for")
        if state in (JobState.PENDING, JobState.RESTARTING) and waits in WAITS:
            short = tuple(view.get("short_of_capacity") or ())
            key = ("waits", rnd, waits, short)
            since = self._waiting.setdefault(key, now)
            if waits != WaitsFor.NODES or now - since >= QUIET_S:  # every round waits for its joins
                self._once(key, since, self._waits(state, waits, short, view), out)
        closed = current["closed_at"] if current is not None else None
        if state is JobState.RUNNING or (closed is not None and view.get("members")):
            # (a round that closed and ended between two polls is told too)
            self._once(("running", rnd), closed or now, self._running(rnd, view), out)
        return out

    @staticmethod
    def _opened(info: RoundView, view: Mapping[str, Any]) -> str:
        if info["spends_restart"]:
            most = view.get("max_restarts")
            spent = f"restart {view.get('restarts', 0)}" + (f" of {most}" if most is not None else "")
            head = f"restarting: round {info['round']} ({spent})"
        else:
            head = f"re-forming: round {info['round']} (no restart spent)"
        detail = info["detail"] or _failure(view)
        why = WHY.get(info["reason"], info["reason"])
        return f"{head}: {why}" + (f": {detail}" if detail else "")

    @staticmethod
    def _waits(state: JobState, waits: str, short: tuple[str, ...], view: Mapping[str, Any]) -> str:
        """Round 0's reason says what it waits for; a later round's also repeats why it opened
        (said already), so that one is told from the fields."""
        head = f"{state.value.lower()}: {WAITS[WaitsFor(waits)]}"
        if state is JobState.PENDING:
            return f"{head}: {view.get('reason', '')}"
        if short:
            return f"{head} on {', '.join(short)}"
        return f"{head} (nnodes {view.get('nnodes', '?')})"

    @staticmethod
    def _running(rnd: int, view: Mapping[str, Any]) -> str:
        members = view.get("members") or []
        world = sum(m["ranks"][1] - m["ranks"][0] + 1 for m in members) or view.get("world_size", 0)
        text = f"running: round {rnd}, world size {world}"
        if len(members) == 1:
            return f"{text} on {members[0]['node']}"
        where = ", ".join(f"{m['node']} ({_ranks(m)})" for m in members)
        return f"{text} on {len(members)} nodes: {where}" if members else text
