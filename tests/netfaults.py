"""Network faults between the hosts of a ``tests.netns.Topology``: cut links, one-way loss, a slow etcd.

Cuts and one-way loss are silent drops at the link layer, made with iproute2 alone (the kernel of
the machines this runs on has neither netem nor tc actions, and CI installs no nftables): the
sender's neighbour entry for the destination is replaced by a permanent one pointing to a MAC
address no port has (``BLACKHOLE_MAC``). The bridge floods such frames and every receiver drops
them as addressed to another host, so the sender sees no error: its TCP connections stall exactly
as across a dead switch port, until they time out. A rule on one side only drops one direction.

- ``cut(topo, a, b)`` drops a -> b and b -> a; ``a``/``b`` are host indices or ``ETCD`` (the bridge
  address, where etcd and the proxy below listen; its side of the rule is in the root namespace,
  on our own bridge).
- ``drop_from(topo, a, to)`` drops only a -> each of ``to``.
- ``Faults`` remembers every rule it made and ``heal`` removes them all; ``Topology.destroy``
  takes the namespaces' rules with the namespaces, and the bridge's with the bridge.

A slow etcd is a delaying TCP relay (``DelayProxy``) between the daemons and etcd: the daemons are
configured with its address, and ``delay_s`` holds back every byte they send to etcd (each
request) by that long, in order. It runs as threads of the process that starts it.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from tests.netns import IFNAME, Topology

ETCD = -1  # the bridge address (etcd, the proxy) as an end of a cut
BLACKHOLE_MAC = "02:00:5e:ff:ff:01"  # locally administered: no port has it


def _ip(argv: list[str], netns: str | None) -> None:
    full = ["ip", *(("-n", netns) if netns else ()), *argv]
    res = subprocess.run(full, capture_output=True, text=True, timeout=20)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({res.returncode}): {res.stderr.strip()}")


@dataclass(frozen=True)
class Rule:
    """Frames from ``netns`` (None: the root namespace) on ``dev`` to ``address`` are dropped."""

    netns: str | None
    dev: str
    address: str


def _end(topo: Topology, end: int) -> tuple[str | None, str, str]:
    """(namespace, device, address) of one end: a host's eth0, or the bridge in the root namespace."""
    if end == ETCD:
        return None, topo.bridge, topo.gateway
    host = topo.hosts[end]
    return host.netns, IFNAME, host.address


@dataclass
class Faults:
    topo: Topology
    rules: list[Rule] = field(default_factory=list)

    def _add(self, rule: Rule) -> None:
        _ip(["neigh", "replace", rule.address, "lladdr", BLACKHOLE_MAC, "dev", rule.dev, "nud", "permanent"],
            rule.netns)  # fmt: skip
        self.rules.append(rule)

    def drop_from(self, a: int, to: list[int]) -> None:
        """Drop what ``a`` sends to each of ``to`` (one direction only)."""
        netns, dev, _ = _end(self.topo, a)
        for b in to:
            self._add(Rule(netns, dev, _end(self.topo, b)[2]))

    def cut(self, a: int, b: int) -> None:
        self.drop_from(a, [b])
        self.drop_from(b, [a])

    def heal(self) -> None:
        """Remove every rule (the next frame re-resolves its neighbour by ARP)."""
        while self.rules:
            rule = self.rules.pop()
            with contextlib.suppress(RuntimeError):  # the namespace may be gone already
                _ip(["neigh", "del", rule.address, "dev", rule.dev], rule.netns)


class DelayProxy:
    """A TCP relay from ``listen`` to ``target`` that delays client -> server bytes by ``delay_s``.

    One thread accepts; each connection gets one thread that pumps both ways with a selector and
    a queue of (due time, bytes) for the delayed direction, so bytes keep their order and a slow
    request does not hold back the responses of earlier ones.
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.delay_s = 0.0
        self._server = socket.create_server(listen, reuse_port=False)
        self._server.settimeout(0.2)
        self.address = self._server.getsockname()[:2]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def start(self) -> None:
        t = threading.Thread(target=self._accept, name="delay-proxy", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.close()
        for t in self._threads:
            t.join(5)
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            t = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        client.settimeout(None)  # select says when to read; a send blocks until the bytes are taken
        upstream.settimeout(None)
        sel.register(client, selectors.EVENT_READ)
        sel.register(upstream, selectors.EVENT_READ)
        held: deque[tuple[float, bytes]] = deque()
        try:
            while not self._stop.is_set():
                timeout = max(0.0, held[0][0] - time.monotonic()) if held else 0.2
                for key, _ in sel.select(min(timeout, 0.2)):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        held.append((time.monotonic() + self.delay_s, data))
                    else:
                        client.sendall(data)
                while held and held[0][0] <= time.monotonic():
                    upstream.sendall(held.popleft()[1])
        except OSError:
            return
        finally:
            sel.close()
            with self._lock:
                self._conns -= {client, upstream}
            client.close()
            upstream.close()
