"""``worker.GracefulStop``: SIGTERM becomes a stop at a step boundary that every rank agrees on.

Its ``should_stop`` is a vote (an all_reduce of MAX): the answer is the same on every rank, and a
signal is never lost, not even one that lands while the rank waits in that vote, where ranks
spend most of a call. Driven by a fake group that plays the other ranks' votes; the signal is a
real SIGTERM to this process."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from elasticd import worker
from elasticd.workers.snapshot_program import collective

torch = pytest.importorskip("torch")


class VotingGroup:
    """``torch.distributed`` as one rank sees it: each all_reduce (MAX) adds the other ranks'
    votes, and may deliver SIGTERM to this process while the rank is in the collective."""

    class ReduceOp:
        MAX = "max"

    def __init__(self, others: list[int], signal_during: frozenset[int] = frozenset()) -> None:
        self.others, self.signal_during, self.calls = others, signal_during, 0
        self.votes: list[int] = []

    def get_backend(self) -> str:
        return "gloo"

    def all_reduce(self, tensor: Any, op: str) -> None:
        assert op == self.ReduceOp.MAX
        self.votes.append(int(tensor.item()))
        tensor.fill_(max([int(tensor.item()), *self.others]))
        if self.calls in self.signal_during:
            signal.raise_signal(signal.SIGTERM)  # its Python handler runs before this returns
        self.calls += 1


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[worker.GracefulStop]]:
    monkeypatch.setattr(worker, "_STOPS", [])
    made: list[worker.GracefulStop] = []
    yield made
    for stop in made:
        stop.restore()


def _stop(
    stops: list[worker.GracefulStop], group: VotingGroup, monkeypatch: pytest.MonkeyPatch
) -> worker.GracefulStop:
    monkeypatch.setattr(collective, "group", lambda: group)
    stop = worker.GracefulStop()
    stops.append(stop)
    return stop


def test_a_signal_during_the_vote_stops_every_rank_at_the_next_one(
    stops: list[worker.GracefulStop], monkeypatch: pytest.MonkeyPatch
) -> None:
    group = VotingGroup(others=[0], signal_during=frozenset({0}))
    stop = _stop(stops, group, monkeypatch)
    assert stop.should_stop() is False  # this rank voted 0 before the signal: nobody stops yet
    assert stop.requested
    assert stop.should_stop() is True  # and votes 1 now: every rank stops after this step
    assert group.votes == [0, 1]
    assert worker._stopping()


def test_another_ranks_vote_stops_a_rank_never_signalled(
    stops: list[worker.GracefulStop], monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = _stop(stops, VotingGroup(others=[0, 1]), monkeypatch)
    assert stop.should_stop() is True
    assert stop.requested and worker._stopping()


def test_no_signal_no_stop(stops: list[worker.GracefulStop], monkeypatch: pytest.MonkeyPatch) -> None:
    group = VotingGroup(others=[0, 0])
    stop = _stop(stops, group, monkeypatch)
    assert [stop.should_stop() for _ in range(3)] == [False, False, False]
    assert group.votes == [0, 0, 0] and not worker._stopping()


def test_a_signal_between_steps_stops_at_the_first_vote(
    stops: list[worker.GracefulStop], monkeypatch: pytest.MonkeyPatch
) -> None:
    group = VotingGroup(others=[0])
    stop = _stop(stops, group, monkeypatch)
    signal.raise_signal(signal.SIGTERM)
    assert stop.should_stop() is True
    assert group.votes == [1]
