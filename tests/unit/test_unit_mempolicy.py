"""A bound rank's memory policy: the nodemask built for ``set_mempolicy(2)`` (pure), the nodes a
fork request may carry to the zygote, the daemon's one try (and one log line) per kind of policy,
and the call itself on this host's kernel, in a throwaway thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.workers import numa_memory
from elasticd.workers.zygote_program import boot
from elasticd.workers.zygote_program.mempolicy import (
    MAX_NODE,
    MPOL_DEFAULT,
    MPOL_PREFERRED,
    MPOL_PREFERRED_MANY,
    current_policy,
    mask_nodes,
    node_mask,
    prefer_nodes,
    preferred_mode,
)


def test_node_mask_words_and_maxnode() -> None:
    assert node_mask([0], 64) == ((1,), 65)  # maxnode: one bit more than the mask holds
    assert node_mask([1, 64], 64) == ((2, 1), 129)
    assert node_mask([63], 64) == ((1 << 63,), 65)
    assert node_mask([3, 3, 33], 32) == ((8, 2), 65)
    assert node_mask(frozenset({2}), 64) == ((4,), 65)


@pytest.mark.parametrize("bad", [[], [-1], [MAX_NODE], [True], ["0"], [0, 1.0]])
def test_node_mask_refuses_what_is_no_node(bad: list[Any]) -> None:
    with pytest.raises(ValueError):
        node_mask(bad, 64)


@given(st.frozensets(st.integers(0, MAX_NODE - 1), min_size=1, max_size=40), st.sampled_from([32, 64]))
def test_node_mask_round_trips(nodes: frozenset[int], bits: int) -> None:
    words, maxnode = node_mask(nodes, bits)
    assert mask_nodes(words, bits) == nodes
    assert all(0 <= w < 1 << bits for w in words) and words[-1]  # no empty word at the end
    assert maxnode - 1 == len(words) * bits > max(nodes)


def test_one_node_is_preferred_several_are_preferred_many() -> None:
    assert preferred_mode([1]) == preferred_mode([1, 1]) == MPOL_PREFERRED
    assert preferred_mode([0, 1]) == MPOL_PREFERRED_MANY


def fork_request(**fields: Any) -> bytes:
    base = {"op": "fork", "id": 1, "argv": ["/py"], "env": {}, "cwd": "/", "fds": ["log", "go"]}
    base["progress_fd"] = None
    return json.dumps(base | fields).encode()


def test_a_fork_request_carries_the_nodes_or_none() -> None:
    assert boot.parse_request(fork_request(mems=[0, 1]), 2)["mems"] == [0, 1]
    assert boot.parse_request(fork_request(mems=None), 2)["mems"] is None
    assert boot.parse_request(fork_request(), 2)["mems"] is None  # (a daemon that sends none)
    for bad in ([], [-1], [MAX_NODE], [True], ["0"], 0, {"0": 1}):
        with pytest.raises(boot.BadRequest):
            boot.parse_request(fork_request(mems=bad), 2)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def test_the_daemon_tries_each_kind_once_and_logs_a_refusal_once(monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[str] = []

    def refused(nodes: frozenset[int]) -> Callable[[], int]:
        def call() -> int:
            tries.append(threading.current_thread().name)
            return 1  # EPERM: a seccomp profile

        return call

    log = Recorder()
    monkeypatch.setattr(numa_memory, "_tried", {})
    monkeypatch.setattr(numa_memory, "_log", log)
    monkeypatch.setattr(numa_memory, "prefer_nodes", refused)
    for _ in range(3):
        assert numa_memory.checked(frozenset({0}))() == 1
    numa_memory.checked(frozenset({0, 1}))
    # one try per kind (one node, several), each in a throwaway thread; the calls after are ours
    me = threading.current_thread().name
    assert tries == ["elasticd-mempolicy", me, me, me, "elasticd-mempolicy"]
    assert [e for e, _ in log.events] == ["numa.mempolicy_refused"] * 2
    assert log.events[0][1]["errno"] == 1 and log.events[0][1]["nodes"] == "0"


def in_a_thread(nodes: list[int]) -> tuple[int, tuple[int, frozenset[int]] | None]:
    """Set and read back a policy in a throwaway thread (the policy is the thread's own)."""
    out: list[tuple[int, tuple[int, frozenset[int]] | None]] = []

    def run() -> None:
        errno = prefer_nodes(nodes)()
        out.append((errno, current_policy() if errno == 0 else None))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    return out[0]


def test_the_kernel_takes_the_policy_of_node_0() -> None:
    errno, policy = in_a_thread([0])
    if errno:
        pytest.skip(f"this kernel refuses set_mempolicy: errno {errno}")
    assert policy == (MPOL_PREFERRED, frozenset({0}))
    assert current_policy() == (MPOL_DEFAULT, frozenset())  # this thread's stays the default
