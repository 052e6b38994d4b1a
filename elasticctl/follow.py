"""Following a job: stream its ranks' output and return when it ends.

Output goes to stdout through ``elasticd.jobs.ranktext.RankOutput`` (``[rankK]: `` at line starts);
on a terminal, unfinished lines are asked for too, so progress bars move as they are drawn. Notes
go to stderr: where the job's other ranks are, attempts, and with ``life`` the job's state changes
(``elasticctl.life``), all from the job view every ``logs`` reply carries.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticctl import render
from elasticctl.client import Client, DaemonError
from elasticctl.exits import EXIT_INTERRUPTED, EXIT_JOB_FAILED
from elasticctl.life import Life, hhmmss
from elasticd.jobs.ranktext import RankOutput
from elasticd.wire import ErrorCode, JobState, JobView, LogsArgs, LogsReply, StatusArgs, is_terminal

POLL_S = 0.2
# After the job ended, how long to wait on while this node still winds its part up: its keeper
# writes the last snapshots within the daemon's own bound (130 s), then stops within 5 s.
FINISH_WAIT_S = 140.0
FINISH_NOTE_S = 1.0  # a wind-up that lasts longer than this is told


@dataclass(frozen=True)
class FollowOptions:
    rank: int | None = None  # only this rank (checked by the daemon)
    attempt: int | None = None
    since: float | None = None  # only attempts that started at or after this time
    tail: int | None = None  # start at each rank's last N lines
    timestamps: bool = False  # prefix lines with the time they were read
    until_end: bool = True
    show: Callable[[int], bool] | None = None  # the ranks whose output is printed (all by default)
    life: bool = False  # tell the job's state changes (instead of attempt headers)
    prog: str = "elasticctl"


def elsewhere(view: Mapping[str, Any], here: str | None, rank: int | None) -> list[tuple[str, int, int]]:
    """(node, first rank, last rank) of the current round's members on nodes other than ``here``
    (the one whose logs we read); only the one holding ``rank`` if given."""
    if here is None:
        return []
    found = []
    for m in view.get("members") or []:
        lo, hi = m["ranks"]
        if m["node"] != here and (rank is None or lo <= rank <= hi):
            found.append((m["node"], lo, hi))
    return found


def elsewhere_notes(job: str, view: Mapping[str, Any], here: str | None, rank: int | None) -> list[str]:
    """Where the ranks whose logs this node does not hold are, and how to read them there (logs
    are served by the node that keeps them: ``elasticctl logs`` on that node)."""
    flag = f" --rank {rank}" if rank is not None else ""
    notes = []
    for node, lo, hi in elsewhere(view, here, rank):
        ranks = f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"
        notes.append(
            f"the logs of {ranks} of {job} are on node {node}: run `elasticctl logs {job}{flag}` there"
        )
    return notes


class _Follower:
    def __init__(self, client: Client, job: str, opts: FollowOptions) -> None:
        self.client, self.job, self.opts = client, job, opts
        self.out = RankOutput(sys.stdout.write, opts.timestamps)
        self.life = Life() if opts.life else None
        self.told: set[str] = set()
        self.attempt_seen = -1
        self.winding_since: float | None = None  # when a reply first said: ended, still winding up here
        self.told_winding_up = False

    def say(self, text: str) -> None:
        self.out.close()  # a terminal line a rank left unfinished ends before the note
        sys.stdout.flush()
        print(f"{self.opts.prog}: {text}", file=sys.stderr, flush=True)

    def notes(self, reply: LogsReply, first: bool, now: float) -> None:
        view = reply.get("job")
        if view is None:  # an older daemon
            return
        if self.life is not None:
            for at, text in self.life.update(view, reply.get("round_info"), now):
                self.say(f"{hhmmss(at)} {text}")
        for note in elsewhere_notes(self.job, view, reply.get("node"), self.opts.rank):
            if note not in self.told:
                self.told.add(note)
                self.say(note)
        since = self.opts.since
        if first and since is not None:
            before = sorted(int(a) for a, t in (reply.get("attempt_started_at") or {}).items() if t < since)
            if before:
                listed = ", ".join(map(str, before))
                self.say(f"attempt(s) {listed} started before {hhmmss(since)} (--since): not shown")

    def winding_up(self, reply: LogsReply, now: float) -> bool:
        """Whether to wait on after the job ended: this node still winds its part up (its
        workers stop, its snapshot keeper writes the last snapshots to their files), so that a
        job submitted next finds those files written. Told once if it lasts; ``FINISH_WAIT_S`` at most."""
        if not reply.get("finishing_here", False):
            return False
        if self.winding_since is None:
            self.winding_since = now
        waited = now - self.winding_since
        if waited >= FINISH_NOTE_S and not self.told_winding_up:
            self.told_winding_up = True
            self.say(f"{self.job} ended; this node is winding it up (its last snapshots written to disk)")
        return waited < FINISH_WAIT_S

    def chunk_attempt(self, attempt: int, started: float | None) -> None:
        if attempt <= self.attempt_seen:
            return
        if self.life is None and (self.attempt_seen >= 0 or attempt > 0):
            self.say(f"attempt {attempt}" + (f", started {hhmmss(started)}" if started else ""))
        self.attempt_seen = attempt

    def run(self) -> LogsReply:
        cursor: dict[str, int] = {}
        first, live = True, False
        partial = sys.stdout.isatty()
        o = self.opts
        try:
            while True:
                args = LogsArgs(
                    self.job, o.rank, cursor, o.attempt, o.since, o.tail if first else None, partial
                )
                try:
                    reply: LogsReply = self.client.request("logs", args)
                except DaemonError as exc:
                    if not (first and partial and exc.code == ErrorCode.INVALID_ARGS):
                        raise
                    partial = False  # an older daemon: whole lines only
                    continue
                now = time.time()
                cursor = reply["cursor"]
                self.notes(reply, first, now)
                starts = reply.get("attempt_started_at") or {}
                for chunk in reply["chunks"]:
                    self.chunk_attempt(chunk["attempt"], starts.get(str(chunk["attempt"])))
                    if o.show is None or o.show(chunk["rank"]):
                        self.out.write(chunk["rank"], chunk["text"], now if live else None)
                sys.stdout.flush()
                first, live = False, live or not reply.get("more", False)
                if not reply["chunks"]:
                    if not o.until_end or (is_terminal(reply["state"]) and not self.winding_up(reply, now)):
                        return reply
                    time.sleep(POLL_S)
        finally:
            self.out.close()
            sys.stdout.flush()


def follow(client: Client, job: str, opts: FollowOptions | None = None) -> LogsReply:
    """Print the job's output (see ``FollowOptions``) until it ends, or with ``until_end`` false
    until what is there now is printed; returns the last logs reply."""
    return _Follower(client, job, opts or FollowOptions()).run()


def follow_to_end(client: Client, job: str, opts: FollowOptions) -> JobView | None:
    """Follow the job until it ends and say how it ended; its final view (None: Ctrl-C, which
    stops only the following)."""
    try:
        reply = follow(client, job, opts)
    except KeyboardInterrupt:
        print(f"\n{opts.prog}: stopped following; {job} keeps running", file=sys.stderr)
        return None
    final = reply.get("job")
    if final is None or final.get("stale") or not is_terminal(final.get("state")):
        final = client.request("status", StatusArgs(job))["job"]
    assert final is not None
    ended = hhmmss(final.get("ended_at") or time.time())
    print(f"{opts.prog}: {ended} {job} {final['state']} after {final.get('restarts', 0)} restart(s)",
          file=sys.stderr)  # fmt: skip
    if final["state"] != JobState.SUCCEEDED:
        detail = render.failure(final) or final.get("error") or final.get("reason", "")
        if detail:
            print(detail, file=sys.stderr)
    return final


def exit_status(final: JobView | None) -> int:
    """How a command that followed a job to its end exits: 0 when it SUCCEEDED."""
    if final is None:
        return EXIT_INTERRUPTED
    return 0 if final["state"] == JobState.SUCCEEDED else EXIT_JOB_FAILED
