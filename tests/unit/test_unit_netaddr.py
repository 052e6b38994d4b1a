"""elasticd.netaddr: port ranges, picking a free port in one (worker_ports), loopback addresses."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest

from elasticd.jobs.attempt import NodeRuntime, master_port
from elasticd.netaddr import NoFreePort, PortRange, free_port, is_loopback, pick_port, port_is_free
from elasticd.node.inventory import Inventory
from elasticd.terms.state import EndReason, SetupFailure


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("29500-29999", PortRange(29500, 29999)),
        (" 1-1 ", PortRange(1, 1)),
        ("65535", PortRange(65535, 65535)),
    ],
)
def test_parse(text: str, want: PortRange) -> None:
    assert PortRange.parse(text) == want
    assert PortRange.parse(str(want)) == want


@pytest.mark.parametrize("text", ["", "x", "10-", "-10", "10-5", "0-5", "1-65536", "1-2-3", "1.5-3"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        PortRange.parse(text)


def test_candidates_visit_every_port_once_from_a_random_start() -> None:
    ports = PortRange(100, 109)
    firsts = set()
    for seed in range(50):
        seen = list(ports.candidates(random.Random(seed)))
        assert seen == [100 + (seen[0] - 100 + i) % 10 for i in range(10)]  # each once, wrapping around
        firsts.add(seen[0])
    assert len(firsts) > 3  # concurrent pickers rarely start at the same port


@pytest.fixture
def free_range() -> Iterator[PortRange]:
    """Four consecutive ports that are free now."""
    for _ in range(200):
        first = random.randrange(20000, 60000)
        if all(port_is_free(p, "0.0.0.0") for p in range(first, first + 4)):
            yield PortRange(first, first + 3)
            return
    pytest.skip("no four consecutive free ports")


def _occupy(stack: ExitStack, port: int) -> None:
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    sock.bind(("0.0.0.0", port))
    sock.listen()


def test_pick_port_in_range(free_range: PortRange) -> None:
    for seed in range(20):
        assert free_range.first <= pick_port("0.0.0.0", free_range, random.Random(seed)) <= free_range.last


def test_pick_port_skips_taken_ports(free_range: PortRange) -> None:
    with ExitStack() as stack:
        for port in (free_range.first, free_range.first + 1, free_range.last):
            _occupy(stack, port)
        for seed in range(20):
            assert pick_port("0.0.0.0", free_range, random.Random(seed)) == free_range.first + 2


def test_pick_port_when_the_range_is_full(free_range: PortRange) -> None:
    with ExitStack() as stack:
        for port in range(free_range.first, free_range.last + 1):
            _occupy(stack, port)
        with pytest.raises(NoFreePort, match=f"worker_ports {free_range}"):
            pick_port("0.0.0.0", free_range)
        rt = NodeRuntime("n1", "127.0.0.1", Path("/nonexistent"), Inventory((), 2), SimpleNamespace(),  # type: ignore[arg-type]
                         worker_ports=free_range)  # fmt: skip
        with pytest.raises(SetupFailure) as info:
            master_port(rt)
        assert info.value.reason is EndReason.SPAWN_FAILED
        assert "node n1" in info.value.message and f"worker_ports {free_range}" in info.value.message


def test_without_a_range_any_free_port() -> None:
    port = pick_port("127.0.0.1", None)
    assert 0 < port <= 65535 and port_is_free(port)
    assert free_port() > 0


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("10.0.1.17", False),
        ("0.0.0.0", False),
        ("gpu-17.example", False),
        ("fe80::1", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
