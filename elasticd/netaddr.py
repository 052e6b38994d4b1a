"""Free TCP ports on this host (for MASTER_PORT, the liveness port and the embedded etcd)."""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass


class NoFreePort(Exception):
    """Every port of a configured range is taken."""


@dataclass(frozen=True)
class PortRange:
    """An inclusive range of TCP ports, written ``29500-29999`` (or one port, ``29500``)."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if not 1 <= self.first <= self.last <= 65535:
            raise ValueError(f"not a port range within 1-65535: {self}")

    @classmethod
    def parse(cls, value: object) -> PortRange:
        first, sep, last = str(value).strip().partition("-")
        return cls(int(first), int(last) if sep else int(first))

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def __len__(self) -> int:
        return self.last - self.first + 1

    def candidates(self, rng: random.Random | None = None) -> Iterator[int]:
        """Every port of the range once, from a random one on (wrapping around), so that nodes and
        jobs picking at the same time on one host rarely try the same port first."""
        start = (rng or random).randrange(len(self))
        for i in range(len(self)):
            yield self.first + (start + i) % len(self)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def listen_error(port: int) -> str | None:
    """Why a process could not listen on ``port`` on every address now (None: it could), probed
    as a ``TCPStore`` server binds (``SO_REUSEADDR``: a port left in TIME_WAIT by the previous
    attempt's store is free, one that something listens on is not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(1)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def pick_port(host: str, ports: PortRange | None, rng: random.Random | None = None) -> int:
    """A port that ``host`` can bind now: any free one, or one of ``ports`` (the ``worker_ports``
    setting, for firewalls). Raises ``NoFreePort`` when the whole range is taken."""
    if ports is None:
        return free_port(host)
    for port in ports.candidates(rng):
        if port_is_free(port, host):
            return port
    raise NoFreePort(f"no free port in worker_ports {ports} ({len(ports)} port(s), all in use)")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or a host name) is this host's loopback only."""
    if address.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
