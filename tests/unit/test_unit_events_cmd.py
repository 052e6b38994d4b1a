"""``elasticctl events``: text and JSON lines, the follow loop with its cursor (a canned client)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from elasticctl.parser import build_parser
from elasticctl.views import events as events_view
from elasticd.wire import EventsArgs, EventView

NOW = 1_700_000_000.0


def view(seq: int, kind: str = "round") -> EventView:
    return {"seq": seq, "happened_at": NOW + seq, "kind": kind, "job": "j-1", "node": "n1",
            "message": f"event {seq}", "fields": {"round": seq}}  # fmt: skip


class Canned:
    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = replies
        self.asked: list[EventsArgs] = []

    def request(self, cmd: str, args: object, timeout_s: float | None = None) -> Any:
        assert cmd == "events" and isinstance(args, EventsArgs)
        self.asked.append(args)
        if not self.replies:
            raise KeyboardInterrupt
        return self.replies.pop(0)


def test_json_lines_have_iso_time_kind_job_node() -> None:
    line = json.loads(events_view.as_json(view(3)))
    assert line["time"].endswith("+00:00") and line["kind"] == "round"
    assert (line["job"], line["node"], line["seq"], line["fields"]) == ("j-1", "n1", 3, {"round": 3})
    assert "round" in events_view.as_text(view(3)) and "event 3" in events_view.as_text(view(3))


def test_follow_polls_with_the_cursor_and_names_bad_events_once(capsys: pytest.CaptureFixture[str]) -> None:
    bad = [{"key": "events/0000000000000002", "why": "time: must be float"}]
    client = Canned([
        {"events": [view(1)], "cursor": 2, "skipped": bad},
        {"events": [], "cursor": 2, "skipped": []},
        {"events": [view(3)], "cursor": 3, "skipped": []},
    ])  # fmt: skip
    ns = build_parser().parse_args(["events", "-f", "j-1", "--json"])
    assert events_view.run(client, ns, sleep=lambda s: None) == 0
    assert [a.after for a in client.asked] == [0, 2, 2, 3] and all(a.job == "j-1" for a in client.asked)
    out, err = capsys.readouterr()
    assert [json.loads(x)["seq"] for x in out.splitlines()] == [1, 3]
    assert err.count("skipped event events/0000000000000002") == 1


def test_without_follow_one_request() -> None:
    client = Canned([{"events": [view(1)], "cursor": 1, "skipped": []}])
    ns = argparse.Namespace(job=None, follow=False, json=False)
    assert events_view.run(client, ns) == 0 and len(client.asked) == 1
