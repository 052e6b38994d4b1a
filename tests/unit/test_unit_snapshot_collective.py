"""The workers' gather of plain data (``snapshot_program.collective``): lengths first, bytes
padded to the longest and trimmed back, with tensor collectives only (torch's ``*_object`` ones
read their bytes through numpy). Driven by a fake group that plays the other ranks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.workers.snapshot_program import collective, restore

torch = pytest.importorskip("torch")


class FakeGroup:
    """``torch.distributed`` as one rank sees it, the other ranks' payloads given: each
    ``all_gather`` hands back what every rank would have sent, padded as the sender pads it."""

    def __init__(self, me: int, others: dict[int, bytes], backend: str = "gloo") -> None:
        self.me, self.others, self.backend = me, others, backend
        self.calls: list[tuple[Any, int]] = []  # (dtype, numel) of each tensor sent

    def get_backend(self) -> str:
        return self.backend

    def get_world_size(self) -> int:
        return len(self.others) + 1

    def all_gather(self, outputs: list[Any], tensor: Any) -> None:
        self.calls.append((tensor.dtype, tensor.numel()))
        for rank, out in enumerate(outputs):
            if rank == self.me:
                out.copy_(tensor)
            elif tensor.dtype == torch.int64:
                out.fill_(len(self.others[rank]))
            else:
                padded = self.others[rank].ljust(tensor.numel(), b"\0")
                out.copy_(torch.tensor(list(padded), dtype=torch.uint8))


@settings(max_examples=50, deadline=None)
@given(payloads=st.lists(st.binary(max_size=64), min_size=1, max_size=5), data=st.data())
def test_every_ranks_bytes_come_back_whole_in_rank_order(payloads: list[bytes], data: st.DataObject) -> None:
    me = data.draw(st.integers(0, len(payloads) - 1))
    group = FakeGroup(me, {r: p for r, p in enumerate(payloads) if r != me})
    assert collective.all_gather_bytes(payloads[me], group) == payloads
    longest = max(1, *(len(p) for p in payloads))
    assert group.calls == [(torch.int64, 1), (torch.uint8, longest)]


def test_alone_there_is_no_collective() -> None:
    assert collective.all_gather_bytes(b"abc", None) == [b"abc"]
    assert collective.all_gather_json({"rank": 0}, None) == [{"rank": 0}]


def test_reports_go_as_json_and_a_garbled_one_is_left_out() -> None:
    theirs = {"rank": 1, "key": None, "proposal": "ab", "address": "10.0.0.2", "port": 7, "held": [[1, 4]]}
    group = FakeGroup(0, {1: json.dumps(theirs).encode(), 2: b"\xff not json"})
    mine = {"rank": 0, "key": "k", "proposal": "cd", "address": "", "port": 0, "held": [[0, 4]]}
    assert restore.gather(mine, group) == [mine, theirs]
    assert collective.all_gather_json(mine, group)[2] is None


def test_under_nccl_the_tensors_are_on_the_current_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collective.device(FakeGroup(0, {}, backend="nccl")) == torch.device("cuda", 3)
    assert collective.device(FakeGroup(0, {}, backend="gloo")) == torch.device("cpu")
