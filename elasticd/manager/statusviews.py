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
from collections.abc import Collection, Mapping
from typing import Any

from elasticd.jobs.board import Board, Queue
from elasticd.jobs.queue import Reason, why
from elasticd.jobs.view import job_row, job_view, selected
from elasticd.rendezvous.snapshot import JobSnapshot
from elasticd.terms.state import JobState

# The states (sorted) and the user a request selects, and whether it asks for rows.
Filter = tuple[tuple[str, ...], str | None, bool]
MAX_REPLIES = 8  # replies kept for the latest read and queue, one per filter


class StatusViews:
    """Views of every job of the latest read, encoded, and the replies made of them (module doc).
    Keeps the latest read's jobs only. Used on one event loop."""

    def __init__(self, node_id: str, board: Board) -> None:
        self._node_id = node_id
        self._board = board
        # Each job's view, its JSON and its row's JSON, by the snapshot they were made from.
        self.held: dict[str, tuple[JobSnapshot, dict[str, Any], bytes, bytes]] = {}
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
        """Make ``snaps`` the latest read: views for the snapshots not seen, the order by age."""
        if snaps is self._read:
            return
        held: dict[str, tuple[JobSnapshot, dict[str, Any], bytes, bytes]] = {}
        for job_id, snap in snaps.items():
            kept = self.held.get(job_id)
            if kept is None or kept[0] is not snap:
                view = job_view(snap, self._node_id)
                kept = (snap, view, json.dumps(view).encode(), json.dumps(job_row(view)).encode())
                self.encoded += 1
            held[job_id] = kept
        self.held, self._read = held, snaps
        self._order = sorted(held, key=lambda j: held[j][1].get("submitted_at") or 0)

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
        parts = []
        for job_id in self._order:
            if (states or user is not None) and not selected(snaps[job_id], chosen, user):
                continue
            held = self.held[job_id]
            encoded = held[3] if rows else held[2]
            place = places.get(job_id)
            if place is None:
                parts.append(encoded)
            elif rows:
                parts.append(encoded[:-1] + b', "queue": {"place": %d, "of": %d}}' % (place[0], of))
            else:
                i, reason = place
                queue = b'"queue": {"place": %d, "of": %d, "why": %s}}' % (i, of, texts[reason])
                parts.append(encoded[:-1] + b", " + queue)
        self.assembled += 1
        return b"[" + b", ".join(parts) + b"]"


def _text(reason: Reason) -> bytes:
    return json.dumps(why(reason)).encode()
