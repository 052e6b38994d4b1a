"""A waiting job's ``status`` says when room is being made for it (``jobs.room.making``): from the
lenders' drain records, through the queue's reasons, to the place ``elasticctl status JOB`` shows."""

from __future__ import annotations

import json
from typing import cast

from elasticctl.render import job_detail
from elasticd.jobs import board
from elasticd.jobs.queue import why
from elasticd.jobs.room import Lent, making, room_by
from elasticd.jobs.ticket import tickets_of
from elasticd.manager import statusviews
from elasticd.rendezvous.jobread import RostersRead
from elasticd.rendezvous.model import DrainRecord
from elasticd.terms.spec import NodeRange
from elasticd.wire import JobView
from tests.fakes import head_of, make_spec

AT = 1.7e9


def test_making_names_each_lender_and_its_nodes_for_each_borrower() -> None:
    lent = [Lent("el", "n3", "hi"), Lent("el", "n1", "hi"), Lent("other", "n5", "hi"), Lent("el", "n4", "b")]
    assert making(lent) == {
        "hi": "making room: shrinking el (n1, n3), other (n5)",
        "b": "making room: shrinking el (n4)",
    }
    assert making([]) == {}


def test_the_reason_says_it_first_and_only_when_there_is_some() -> None:
    plain = why((5, 0, "u", 1, 0, False, ""))
    assert "making room" not in plain
    said = why((5, 0, "u", 1, 0, False, "making room: shrinking el (n3)"))
    assert said.startswith("priority 5; making room: shrinking el (n3); u's waiting job 1")


def _snap(job_id: str, at: float, priority: int, drains: dict[str, DrainRecord] | None = None) -> RostersRead:
    spec = make_spec(id=job_id, submitted_at=at, priority=priority, nnodes=NodeRange(1, 1))
    return RostersRead(job_id, head=head_of(spec), found=1, drains=drains or {})


def test_status_of_the_waiting_job_says_which_job_shrinks_for_it_and_stops_once_given_back() -> None:
    lend = {"n3": DrainRecord(None, AT, room_by("hi")), "n9": DrainRecord(None, AT, "alice")}
    reads = {"el": _snap("el", AT, 0, lend), "hi": _snap("hi", AT + 1, 5)}
    queue = board.queue(reads, tickets_of(reads.values()), {})
    place = queue.place("hi")
    assert place is not None and "making room: shrinking el (n3); " in place.why  # n9: an operator's
    held = {job: statusviews.held(read, "n1", None) for job, read in reads.items()}
    order = statusviews.oldest_first(held)
    reply = statusviews.reply(reads, held, order, queue.ranked, statusviews.selection((), None, False))
    listed = {v["id"]: v for v in json.loads(reply)}
    assert listed["hi"]["queue"]["why"] == place.why
    assert "making room" not in listed["el"]["queue"]["why"]
    shown = job_detail(cast(JobView, listed["hi"]), AT + 2)
    assert "waiting (priority 5; making room: shrinking el (n3);" in shown
    given_back = {"el": _snap("el", AT, 0), "hi": reads["hi"]}  # the record deleted: a new read
    again = board.queue(given_back, tickets_of(given_back.values()), {}).place("hi")
    assert again is not None and "making room" not in again.why
