"""elasticctl decodes a reply with the cycle collector paused: a reply of every job is tens of
thousands of containers, and collections mid-decode (full ones among them) were half the time of
``status --json`` with a thousand jobs (bench/bench_queue_load.py)."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest

from elasticctl.client import decode


@pytest.fixture
def collections() -> Iterator[list[int]]:
    seen: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)


def big_reply() -> bytes:
    job = {"id": "j", "state": "PENDING", "argv": ["python", "-u", "train.py"], "queue": {"place": 1}}
    return json.dumps({"ok": True, "result": {"jobs": [dict(job, n=i) for i in range(5000)]}}).encode()


def test_a_big_reply_is_decoded_with_no_collection_and_the_collector_as_it_was(
    collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = big_reply()
    during: list[tuple[int, bool]] = []  # collections while json decoded, and the collector's state
    real = json.loads

    def spy(data: bytes) -> Any:
        before = len(collections)
        out = real(data)
        during.append((len(collections) - before, gc.isenabled()))
        return out

    monkeypatch.setattr(json, "loads", spy)
    assert gc.isenabled()
    reply = decode(raw)
    assert during == [(0, False)] and gc.isenabled()
    assert len(reply["result"]["jobs"]) == 5000 and reply["result"]["jobs"][-1]["n"] == 4999
    gc.disable()
    try:
        decode(raw)
        assert not gc.isenabled()  # a caller that paused it keeps it paused
    finally:
        gc.enable()


def test_a_bad_reply_still_raises_and_restores_the_collector() -> None:
    with pytest.raises(json.JSONDecodeError):
        decode(b"{not json")
    assert gc.isenabled()
