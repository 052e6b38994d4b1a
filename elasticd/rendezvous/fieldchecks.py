"""The checks a field of a stored record must pass, one per kind of value: a node id, an address,
a port, a time, a grace, a stored failure.

etcd is shared, so every record (``rendezvous.model``) runs these in its ``__post_init__``, when
it is read and when the daemon builds it alike: a value that would make a member crash, or run
workers with a nonsensical world, is refused where it is read, and never written. Each raises
``ValueError`` naming the field (``elasticd.decode`` reports it with the record's path). No I/O.
"""

from __future__ import annotations

import math
import re
from typing import Any

from elasticd.decode import decode
from elasticd.terms.ids import valid_node_id
from elasticd.terms.spec import MAX_NPROC_PER_NODE
from elasticd.terms.state import WorkerFailure

MAX_GRACE_S = 3600.0
# Host names, IPv4 and IPv6 literals: what MASTER_ADDR and a liveness probe may be given.
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:%\[\]-]{1,255}$")


def need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_node(name: str, node: str) -> None:
    need(valid_node_id(node), f"{name} must be a node id, got {node[:80]!r}")


def check_address(name: str, address: str) -> None:
    need(bool(_ADDRESS.match(address)), f"{name} must be a host name or IP address, got {address[:80]!r}")


def check_port(name: str, port: int, low: int = 1) -> None:
    need(low <= port <= 65535, f"{name} must be {low}..65535, got {port}")


def check_time(name: str, value: float) -> None:
    need(math.isfinite(value) and value >= 0, f"{name} must be a time (seconds since the epoch)")


def check_grace(grace_s: float | None) -> None:
    need(grace_s is None or 0 <= grace_s <= MAX_GRACE_S, f"grace_s must be 0..{MAX_GRACE_S:g} or null")


def check_node_part(node: str, address: str, liveness_port: int, local_world_size: int) -> None:
    """What a join and a result's member both say about one node's part in a round."""
    check_node("node", node)
    check_address("address", address)
    check_port("liveness_port", liveness_port, 0)
    need(
        1 <= local_world_size <= MAX_NPROC_PER_NODE,
        f"local_world_size must be 1..{MAX_NPROC_PER_NODE}, got {local_world_size}",
    )


def check_failure(failure: dict[str, Any] | None) -> None:
    """A stored failure must read as a ``WorkerFailure``: status and the CLI show it field by field."""
    if failure is not None:
        decode(WorkerFailure, failure, path="failure")
