"""``status`` of every job: each job's view encoded once, and the reply spliced from the encodings.

A thousand queued jobs make a reply of ~800 KB. Building it from the jobs at every call (a view
and a JSON encoding per job, a reason's text per waiting job) would take ~25 ms of the daemon's
one event loop. So the reply is made of parts, each made from the copy of every job and kept
until what it was made from changes (``ClusterCopy.derive``, ``ClusterCopy.each``):

- each job's view, and its JSON and its row's, made once per read of the job (``held``);
- the jobs oldest first, once per change of the copy (``oldest_first``);
- the queue, once per change and admission (``jobs/board.py``), each reason's text once (``_text``);
- the reply, once per change, admission count and filter (``reply``), by splicing each waiting
  job's place into its encoded view.

After one change a ``status`` encodes one view and splices a thousand (a join of held bytes);
with nothing changed it sends the bytes it sent last. The table's ``status`` asks for rows
(``JobRow``: a view's few fields the table shows, and a place without its why), each encoded
once per read of the job beside its view: a sixth of the bytes, which is what the client's
decoding of the reply costs. Pure: no I/O and no clock.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from elasticd.jobs.board import Queue
from elasticd.jobs.queue import Reason, why
from elasticd.jobs.view import job_row, job_view, selected
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.model import NodeStatus
from elasticd.rendezvous.reportread import with_reports
from elasticd.terms.state import JobState

# The states (sorted) and the user a request selects, and whether it asks for rows.
Filter = tuple[tuple[str, ...], str | None, bool]
MAX_TEXTS = 16_384  # reasons' texts kept: a long queue's, and those of the queues before it


class Held(NamedTuple):
    """A job's view and what a reply is made of, made once per read of the job."""

    view: dict[str, Any]
    # The view and its ``JobRow`` as JSON objects without their closing brace: a reply puts a
    # waiting job's place there, then the brace (no copy of the encoding per reply).
    open_view: bytes
    open_row: bytes
    submitted_at: float  # what the replies are ordered by (0: none known)


def held(read: JobRead, node_id: str, own: NodeStatus | None) -> Held:
    """``read``'s view as ``node_id`` shows it, and its encodings. ``own``: this node's status in
    the job, as its agent knows it: the read of every job carries no node's status, and a view
    shows this node's devices and pids."""
    shown = with_reports(read, {node_id: own}) if own is not None else read
    view = job_view(shown, node_id)
    encoded, row = json.dumps(view).encode(), json.dumps(job_row(view)).encode()
    return Held(view, encoded[:-1], row[:-1], view.get("submitted_at") or 0)


def oldest_first(held: Mapping[str, Held]) -> list[str]:
    """The jobs of ``held``, by submission time (jobs submitted at once: in ``held``'s order)."""
    return sorted(held, key=lambda job: held[job].submitted_at)


def selection(states: Collection[JobState], user: str | None, rows: bool) -> Filter:
    """What a request selects, as the one key of its reply."""
    return (tuple(sorted(s.value for s in states)), user, rows)


def views(
    reads: Mapping[str, JobRead],
    held: Mapping[str, Held],
    order: Sequence[str],
    queue: Queue,
    states: Collection[JobState],
    user: str | None,
) -> list[dict[str, Any]]:
    """Every job of ``reads`` that the filters keep, in ``order``, each with its queue place."""
    out = []
    for job_id in order:
        if selected(reads[job_id], states, user):
            place = queue.place(job_id)
            view = held[job_id].view  # (shared: a copy goes out)
            out.append(view | ({} if place is None else {"queue": place.to_json()}))
    return out


def reply(
    reads: Mapping[str, JobRead],
    held: Mapping[str, Held],
    order: Sequence[str],
    ranked: Sequence[tuple[str, Reason]],
    key: Filter,
) -> bytes:
    """``views`` as a JSON array (of their rows, when ``key`` asks for rows): each view (or row) as
    encoded, a waiting job's with its ``queue`` field added (the encoding ``json.dumps`` gives
    ``QueuePlace.to_json()``; a row's, without why)."""
    states, user, rows = key
    places = {job: (i, reason) for i, (job, reason) in enumerate(ranked, 1)}
    of, chosen = len(ranked), tuple(JobState(s) for s in states)
    # One join of pieces, each job's encoding as it is held: a thousand jobs' views are ~1 MB,
    # which a copy per job (to put its place in) and per bracket would copy twice more.
    pieces: list[bytes] = []
    for job_id in order:
        if (states or user is not None) and not selected(reads[job_id], chosen, user):
            continue
        kept = held[job_id]
        place = places.get(job_id)
        if place is None:
            pieces += (b", ", kept.open_row if rows else kept.open_view, b"}")
        elif rows:
            pieces += (b", ", kept.open_row, b', "queue": {"place": %d, "of": %d}}' % (place[0], of))
        else:
            i, reason = place
            queue = b', "queue": {"place": %d, "of": %d, "why": ' % (i, of)
            pieces += (b", ", kept.open_view, queue, _text(reason), b"}}")
    if not pieces:
        return b"[]"
    pieces[0] = b"["
    pieces.append(b"]")
    return b"".join(pieces)


@lru_cache(maxsize=MAX_TEXTS)
def _text(reason: Reason) -> bytes:
    """A place's reason as JSON: most places keep theirs when one job comes or goes."""
    return json.dumps(why(reason)).encode()
