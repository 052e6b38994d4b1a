"""``status`` of every job, at a cost that follows what changed, not how many jobs are queued.

A thousand queued jobs make a reply of ~800 KB. Building it from the jobs at every call (a view
and a JSON encoding per job, a ticket per job for the queue, a reason's text per waiting job)
would take ~25 ms of the daemon's one event loop, and a submit right before it changes the read,
so nothing built for the last call can be given out again. So:

- each job's view and its JSON are made once per snapshot (the read hands out the same snapshot
  while the job's keys are unchanged: ``manager/jobsread.py``);
- the queue (order, places and the reasons' values) is made once per read and admission count
  (``jobs/board.py``), each reason's text once (``jobs.queue.why``), and kept encoded here;
- the reply is assembled once per read, admission count and filter, by splicing each waiting
  job's place into its encoded view, and given out as it is until one of them changes.

After one change a ``status`` encodes one view and splices a thousand (a join of cached bytes);
with nothing changed it sends the bytes it sent last. The table's ``status`` asks for rows
(``JobRow``: a view's few fields the table shows, and a place without its why), each encoded
once per snapshot beside its view: a sixth of the bytes, which is what the client's decoding of
the reply costs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

from elasticd.jobs.board import Board, Queue
from elasticd.jobs.queue import Reason, why
from elasticd.jobs.view import job_row, job_view, selected
from elasticd.rendezvous.model import NodeStatus
from elasticd.rendezvous.reportread import with_reports
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.terms.state import JobState

# The states (sorted) and the user a request selects, and whether it asks for rows.
Filter = tuple[tuple[str, ...], str | None, bool]
MAX_REPLIES = 8  # replies kept for the latest read and queue, one per filter


class Held(NamedTuple):
    """A job's view and what a reply is made of, made once per snapshot."""

    snap: JobSnapshot
    view: dict[str, Any]
    # The view and its ``JobRow`` as JSON objects without their closing brace: a reply puts a
    # waiting job's place there, then the brace (no copy of the encoding per reply).
    open_view: bytes
    open_row: bytes
    submitted_at: float  # what the replies are ordered by (0: none known)
    own: NodeStatus | None = None  # this node's status the view shows (from its agent)


class StatusViews:
    """Views of every job of the latest read, encoded, and the replies made of them (module doc).
    Keeps the latest read's jobs only. Used on one event loop."""

    def __init__(
        self, node_id: str, board: Board, own: Callable[[], Mapping[str, NodeStatus]] = dict
    ) -> None:
        self._node_id = node_id
        self._board = board
        # This node's status in each job it takes part in, as its agents know it: the read of
        # every job carries no node's status, and a view of a job shows this node's devices and
        # pids. A view is made again when it changes (its state, devices or pids).
        self._own = own
        self._owned: Mapping[str, NodeStatus] = {}
        # Each job's view, its JSON and its row's JSON, by the snapshot they were made from.
        self.held: dict[str, Held] = {}
        self._read: Mapping[str, JobSnapshot] | None = None
        self._queue: Queue | None = None  # the queue the replies were assembled with
        self._order: list[str] = []  # the latest read's jobs, oldest first
        self._why: dict[Reason, bytes] = {}  # each reason's text, as JSON
        self._replies: dict[Filter, bytes] = {}  # of the latest read and queue, by filter
        self.encoded = 0  # views encoded: what the tests count
        self.assembled = 0  # replies assembled

    def views(
        self, snaps: Mapping[str, JobSnapshot], states: Collection[JobState], user: str | None
    ) -> list[dict[str, Any]]:
        """Every job of ``snaps`` that the filters keep, oldest first, each with its queue place."""
        self._take(snaps)
        queue = self._board.queue(snaps)
        out = []
        for job_id in self._order:
            if selected(snaps[job_id], states, user):
                place = queue.place(job_id)
                view = self.held[job_id][1]  # (shared: a copy goes out)
                out.append(view | ({} if place is None else {"queue": place.to_json()}))
        return out

    def json(
        self,
        snaps: Mapping[str, JobSnapshot],
        states: Collection[JobState],
        user: str | None,
        rows: bool = False,
    ) -> bytes:
        """``views`` as a JSON array (of their ``JobRow``s with ``rows``), assembled once per read,
        admission count and filter."""
        self._take(snaps)
        queue = self._board.queue(snaps)  # a new one for a new read, or after an admission
        if queue is not self._queue:
            self._queue, self._replies = queue, {}
        key = (tuple(sorted(s.value for s in states)), user, rows)
        reply = self._replies.get(key)
        if reply is None:
            if len(self._replies) >= MAX_REPLIES:
                self._replies.clear()
            reply = self._replies[key] = self._assemble(snaps, queue.ranked, key)
        return reply

    def _take(self, snaps: Mapping[str, JobSnapshot]) -> None:
        """Make ``snaps`` the latest read: views for the snapshots not seen (or whose job's status
        of this node changed), the order by age."""
        own = self._own()
        if snaps is self._read and own == self._owned:
            return
        if own != self._owned:
            self._replies = {}  # (views in them change)
        held: dict[str, Held] = {}
        added: list[str] = []  # jobs not held before
        moved = False  # whether a job held before has another submission time now
        for job_id, snap in snaps.items():
            kept, mine = self.held.get(job_id), own.get(job_id)
            if kept is None or kept.snap is not snap or kept.own != mine:
                shown = with_reports(snap, {self._node_id: mine}) if mine is not None else snap
                view = job_view(shown, self._node_id)
                encoded, row = json.dumps(view).encode(), json.dumps(job_row(view)).encode()
                new = Held(snap, view, encoded[:-1], row[:-1], view.get("submitted_at") or 0, mine)
                self.encoded += 1
                if kept is None:
                    added.append(job_id)
                moved = moved or (kept is not None and kept.submitted_at != new.submitted_at)
                kept = new
            held[job_id] = kept
        self._order = _ordered(self._order, held, added, moved)
        self.held, self._read, self._owned = held, snaps, own

    def _assemble(
        self, snaps: Mapping[str, JobSnapshot], ranked: list[tuple[str, Reason]], key: Filter
    ) -> bytes:
        """The JSON array: each view (or row) as encoded, a waiting job's with its ``queue`` field
        added (the encoding ``json.dumps`` gives ``QueuePlace.to_json()``; a row's, without why)."""
        states, user, rows = key
        places = {job: (i, reason) for i, (job, reason) in enumerate(ranked, 1)}
        if not rows:
            self._why = {reason: self._why.get(reason) or _text(reason) for _, reason in ranked}
        texts = self._why  # only the latest queue's reasons are kept
        of, chosen = len(ranked), tuple(JobState(s) for s in states)
        # One join of pieces, each job's encoding as it is held: a thousand jobs' views are ~1 MB,
        # which a copy per job (to put its place in) and per bracket would copy twice more.
        pieces: list[bytes] = []
        for job_id in self._order:
            if (states or user is not None) and not selected(snaps[job_id], chosen, user):
                continue
            held = self.held[job_id]
            place = places.get(job_id)
            if place is None:
                pieces += (b", ", held.open_row if rows else held.open_view, b"}")
            elif rows:
                pieces += (b", ", held.open_row, b', "queue": {"place": %d, "of": %d}}' % (place[0], of))
            else:
                i, reason = place
                queue = b', "queue": {"place": %d, "of": %d, "why": ' % (i, of)
                pieces += (b", ", held.open_view, queue, texts[reason], b"}}")
        self.assembled += 1
        if not pieces:
            return b"[]"
        pieces[0] = b"["
        pieces.append(b"]")
        return b"".join(pieces)


def _text(reason: Reason) -> bytes:
    return json.dumps(why(reason)).encode()


def _ordered(order: list[str], now: Mapping[str, Held], added: list[str], moved: bool) -> list[str]:
    """The jobs of ``now``, oldest first, from ``order`` (the jobs held before, so ordered):
    without the jobs gone, and with ``added`` (the jobs not held before) after them when they
    are all newer (a submit's), where a sort puts them too; else (or when a job held before has
    another submission time: ``moved``) sorted again."""
    if not moved:
        kept = order if len(now) == len(order) + len(added) else [j for j in order if j in now]
        last = now[kept[-1]].submitted_at if kept else float("-inf")
        if all(now[j].submitted_at > last for j in added):
            return kept + sorted(added, key=lambda j: now[j].submitted_at)
    return sorted(now, key=lambda j: now[j].submitted_at)
