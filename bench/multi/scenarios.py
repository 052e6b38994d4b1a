"""The two scenarios' timing, the same for both launchers: world 2 up, a node lost, the
survivor's first collective at world 1 (loss); a node's leave requested, the next ledger step at
world 1, and the steps lost (drain)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from multi.cluster import Cluster
from multi.daemon import Daemon, first_event
from multi.procs import alive as _alive
from multi.stamps import read_ledger, read_ledger_stat, stamps, world2_round
from multi.trial import IDLE_END_S, POLL_S, STEPS_AFTER_RESUME, WARM_S, Trial


def _drain_seen(tr: Trial, daemons: list[Daemon], t_req: float) -> None:
    """When, after the request, a daemon bumped the round (the drained one: it logs the bump it
    made) and the first started the world-1 attempt."""
    bumps = [first_event(x, "round.bumped", t_req) for x in daemons]
    tr.detect_s = min((b for b in bumps if b is not None), default=None)
    starts = [first_event(x, "attempt.started", t_req, world_size=1) for x in daemons]
    tr.relaunch_s = min((b for b in starts if b is not None), default=None)


class Scenarios(Cluster):
    """Loss and drain, given a launcher's way to kill a node or ask it to leave."""

    def loss_common(self, tr: Trial, out: Path, deadline: float, t_launch: float, survivors: dict[str, Any],
                    kill: Any) -> None:  # fmt: skip
        """Wait for world 2, run WARM_S, kill one node, time the survivor's world-1 collective."""
        up = None
        while time.monotonic() < deadline:
            up = world2_round(out)
            if up:
                break
            if dead := [n for n, x in survivors.items() if not _alive(x)]:
                raise RuntimeError(f"{dead} exited before world 2 was up")
            time.sleep(0.05)
        if not up:
            tr.timed_out = True
            raise RuntimeError(f"world 2 not up within {self.ns.timeout:.0f}s (stamps: {stamps(out)})")
        tr.startup_s = max(s.time for s in up) - t_launch
        tr.ranks = {str(s.rank): s.node for s in up}
        time.sleep(max(0.0, max(s.time for s in up) + WARM_S - time.time()))
        nodes = list(survivors)
        if tr.launcher == "torchrun":
            tr.store_host = nodes[0]
            victim = nodes[0] if tr.variant == "rank0" else nodes[1]
        else:
            victim = up[0].node if tr.variant == "rank0" else up[1].node
        survivor = next(n for n in nodes if n != victim)
        tr.victim, tr.victim_had_rank0 = victim, up[0].node == victim
        t_kill = kill(tr, victim, survivors)
        while time.monotonic() < deadline:
            got = [s for s in stamps(out) if s.time > t_kill and s.world == 1 and s.node == survivor]
            if got:
                tr.value_s, tr.recovered_round, tr.ok = got[0].time - t_kill, got[0].round, True
                tr.relaunch_s = got[0].launched - t_kill
                if tr.launcher == "elasticd":
                    tr.detect_s = first_event(survivors[survivor], "round.bumped", t_kill)
                return
            if not _alive(survivors[survivor]):
                tr.survivor_exited = True
                rc = survivors[survivor].proc.returncode
                tr.note(f"survivor {survivor} exited with {rc} {time.time() - t_kill:.1f}s after the kill")
                return
            time.sleep(POLL_S)
        tr.timed_out = True
        tr.note(f"no world-1 collective on {survivor} within the {self.ns.timeout:.0f}s trial timeout")

    @staticmethod
    def example_args(out: Path) -> list[str]:
        return [
            "--steps",
            "400",
            "--step-time",
            "0.05",
            "--every",
            "100000",
            "--checkpoint",
            str(out / "ckpt.pt"),
        ]

    def wait_steps(self, tr: Trial, book: Path, world: int, n: int, deadline: float, alive: dict[str, Any],
                   t_launch: float | None = None, since: int = 0) -> None:  # fmt: skip
        """Until the ledger has ``n`` lines at ``world`` (from line ``since`` on)."""
        while time.monotonic() < deadline:
            entries = read_ledger(book)
            at = [e for e in entries[since:] if e[1] == world]
            if len(at) >= n:
                return
            if t_launch is not None and at and tr.startup_s is None:
                tr.startup_s = time.time() - t_launch
            if dead := [k for k, x in alive.items() if not _alive(x)]:
                raise RuntimeError(f"{dead} exited while waiting for {n} steps at world {world}")
            time.sleep(0.05)
        tr.timed_out = True
        raise RuntimeError(f"not {n} steps at world {world} within the {self.ns.timeout:.0f}s trial timeout")

    def drain_common(
        self,
        tr: Trial,
        book: Path,
        deadline: float,
        request: Any,
        survivors: dict[str, Any],
        idle: Any = None,
        daemons: list[Daemon] | None = None,
    ) -> None:
        """Request the leave, then time the first ledger line at world 1; then ~20 more steps.

        ``idle()`` (torchrun): true while the surviving agent runs no worker. If that lasts
        IDLE_END_S with no new step, training ended there too: no resume, the trial stops.
        """
        n_before = len(read_ledger(book))  # world-1 lines before this (a slow start-up) do not count
        t_req = time.time()
        request()
        tr.request_s = time.time() - t_req
        idle_since: float | None = None
        while time.monotonic() < deadline:
            entries, mtime = read_ledger_stat(book)
            now = time.time()  # after the read: the line was there by then
            at1 = [i for i in range(n_before, len(entries)) if entries[i][1] == 1]
            if at1:
                # The ledger is appended once per step: if the world-1 line is the last one, the
                # file's mtime (taken with the same read) is when it was written; else our poll time.
                last = at1[0] == len(entries) - 1 and mtime is not None and t_req <= mtime <= now
                resumed = mtime if last and mtime is not None else now
                tr.value_s, tr.ok = resumed - t_req, True
                if daemons:
                    _drain_seen(tr, daemons, t_req)
                break
            if dead := [k for k, x in survivors.items() if not _alive(x)]:
                tr.survivor_exited = True
                rcs = {k: survivors[k].proc.returncode for k in dead}
                after = time.time() - t_req
                tr.note(f"no step at world 1: the survivor exited {rcs} {after:.1f}s after the request")
                return
            if idle is not None and idle():
                idle_since = idle_since or now
                if now - idle_since >= IDLE_END_S:
                    tr.job_ended = True
                    tr.note(
                        f"no step at world 1: the surviving agent has run no worker since "
                        f"{idle_since - t_req:.1f}s after the request (its worker stopped too) and has "
                        f"not restarted one in {IDLE_END_S:.0f}s; agent still alive"
                    )
                    return
            else:
                idle_since = None
            time.sleep(POLL_S)
        else:
            tr.timed_out = True
            tr.note(f"no step at world 1 within the {self.ns.timeout:.0f}s trial timeout")
            return
        with contextlib.suppress(RuntimeError):
            self.wait_steps(tr, book, 1, STEPS_AFTER_RESUME, min(deadline, time.monotonic() + 30), survivors,
                            since=n_before)  # fmt: skip
        tr.timed_out = False  # the sample is in; a slow tail only shortens the run after it

    @staticmethod
    def ledger_result(tr: Trial, book: Path) -> None:
        entries = read_ledger(book)
        if not entries:
            return
        tr.ledger_lines = len(entries)
        tr.distinct_steps = len({s for s, _ in entries})
        tr.steps_lost = tr.ledger_lines - tr.distinct_steps
        tr.worlds = [w for i, (_, w) in enumerate(entries) if i == 0 or entries[i - 1][1] != w]
        first2 = next((i for i, e in enumerate(entries) if e[1] == 2), len(entries))
        first1 = next((i for i in range(first2, len(entries)) if entries[i][1] == 1), None)
        if first1 is not None:
            tr.resume_step = entries[first1][0]
            before = [s for s, w in entries[:first1] if w == 2]
            tr.last_step_before = before[-1] if before else None
