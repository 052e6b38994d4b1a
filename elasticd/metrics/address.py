"""``metrics_address``: ``HOST:PORT``, ``:PORT`` or ``PORT`` (loopback), ``[V6]:PORT``.

Only a port means loopback: the endpoint tells anyone who can reach it what runs on the node, so
it listens on other interfaces only when an address says so.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from elasticd.errors import ConfigError

LOOPBACK = "127.0.0.1"
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, value: object) -> HostPort:
        """ConfigError, saying what is accepted, for anything else."""
        text = str(value).strip()
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = "", text
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if not _is_ip(host, 6):
                raise _bad(text, f"{host!r} is not an IPv6 address")
        elif ":" in host or (host and not (_is_ip(host, 4) or _HOSTNAME.match(host))):
            raise _bad(text, f"{host!r} is not a host name or an address (IPv6 goes in brackets)")
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise _bad(text, f"{port!r} is not a port (1-65535)")
        return cls(host or LOOPBACK, int(port))


def _is_ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(
        f"metrics_address {text[:100]!r}: {why}; use HOST:PORT, :PORT or PORT (loopback), or [IPV6]:PORT"
    )
