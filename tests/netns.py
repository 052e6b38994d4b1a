"""Hosts as network namespaces on one machine: a bridge, one namespace per host, an etcd on the bridge.

Topology (``X`` is picked at random per run, among the 10.231.X.0/24 subnets not in use here)::

    root namespace:  ebr<tag> 10.231.X.1/24  <- etcd listens here
                       |-- ev<tag>-0  <veth>  eth0 10.231.X.10/24 in namespace eh<tag>-0
                       |-- ev<tag>-1  <veth>  eth0 10.231.X.11/24 in namespace eh<tag>-1

Nothing is routed anywhere else: the namespaces have no default route and the bridge has no uplink.
Every name fits the kernel's 15-character limit. ``Topology.destroy`` removes all it created (and
kills any process still inside one of its namespaces), whatever state ``create`` got to.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from elasticd.netaddr import free_port
from tests.support import PYTHON, DaemonProc, EtcdServer, wait_for

SUBNET_PREFIX = "10.231"
IFNAME = "eth0"  # the veth end inside each namespace


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or None when they can (probed for real)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"ehprobe{uuid.uuid4().hex[:6]}"
    try:
        res = _ip("netns", "add", probe, check=False)
        if res.returncode != 0:
            return f"`ip netns add` does not work here: {res.stderr.strip()}"
        res = _ip("netns", "exec", probe, "ip", "link", "set", "lo", "up", check=False)
        if res.returncode != 0:
            return f"`ip netns exec` does not work here: {res.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` does not work here: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def netns_pids(netns: str) -> list[int]:
    res = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _empty(netns: str) -> bool:
    return not netns_pids(netns)


def netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


@dataclass
class Host:
    index: int
    netns: str
    address: str
    veth: str  # the end in the root namespace, on the bridge


@dataclass
class Topology:
    n_hosts: int = 2
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:4])
    subnet: int = -1
    hosts: list[Host] = field(default_factory=list)
    _bridge_created: bool = False
    _namespaces: list[str] = field(default_factory=list)
    _veths: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"ebr{self.tag}"

    @property
    def gateway(self) -> str:
        """The bridge's address in the root namespace, reachable from every host namespace."""
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    def address(self, i: int) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{10 + i}"

    def _pick_subnet(self) -> int:
        used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
        free = [x for x in range(1, 255) if f"{SUBNET_PREFIX}.{x}." not in used]
        if not free:
            raise RuntimeError(f"every {SUBNET_PREFIX}.X.0/24 subnet is in use")
        return random.choice(free)

    def create(self, attempts: int = 3) -> None:
        """Build the topology; on a clash with a concurrent run (same tag or subnet), retry afresh."""
        for attempt in range(attempts):
            try:
                self._create()
                return
            except RuntimeError:
                self.destroy()
                if attempt == attempts - 1:
                    raise
                self.tag = uuid.uuid4().hex[:4]
                self.hosts.clear()
            except BaseException:
                self.destroy()
                raise

    def _create(self) -> None:
        self.subnet = self._pick_subnet()
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_created = True
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        addrs = _ip("-4", "-o", "addr").stdout.splitlines()
        holders = [line for line in addrs if f" {self.gateway}/" in line]
        if len(holders) != 1:  # another run took the same subnet at the same time
            raise RuntimeError(f"{self.gateway} is also used elsewhere: {holders}")
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n_hosts):
            host = Host(i, f"eh{self.tag}-{i}", self.address(i), f"ev{self.tag}-{i}")
            _ip("netns", "add", host.netns)
            self._namespaces.append(host.netns)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", IFNAME, "netns", host.netns)
            self._veths.append(host.veth)
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
            _ip("link", "set", "lo", "up", netns=host.netns)
            _ip("addr", "add", f"{host.address}/24", "dev", IFNAME, netns=host.netns)
            _ip("link", "set", IFNAME, "up", netns=host.netns)
            self.hosts.append(host)
        for host in self.hosts:  # the bridge forwards once the ports are up (no STP delay)
            wait_for(
                functools.partial(self._reaches_gateway, host),
                15,
                0.1,
                f"{host.netns} to reach {self.bridge}",
            )

    def _reaches_gateway(self, host: Host) -> bool:
        """A TCP connect from the namespace to a closed port of the bridge address: a refusal
        (RST) proves the path works both ways; a timeout or "unreachable" means not yet."""
        probe = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(({self.gateway!r}, 9), timeout=1).close()\n"
            "except ConnectionRefusedError:\n"
            "    pass\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        res = subprocess.run(
            ["ip", "netns", "exec", host.netns, PYTHON, "-c", probe], capture_output=True, timeout=10
        )
        return res.returncode == 0

    def destroy(self) -> None:
        """Kill whatever still runs in our namespaces, then delete namespaces, veths and the bridge."""
        for netns in self._namespaces:
            for pid in netns_pids(netns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(AssertionError):
                wait_for(functools.partial(_empty, netns), 10, 0.1)
        for netns in self._namespaces:
            _ip("netns", "del", netns, check=False)
        for veth in self._veths:  # normally gone with their namespace's end
            if _ip("link", "show", veth, check=False).returncode == 0:
                _ip("link", "del", veth, check=False)
        if self._bridge_created:
            _ip("link", "del", self.bridge, check=False)
        self._namespaces.clear()
        self._veths.clear()
        self._bridge_created = False

    def leftovers(self) -> list[str]:
        """What ``destroy`` should have removed but did not."""
        left = []
        existing = _ip("netns", "list", check=False).stdout.split()
        left += [n for n in existing if n.startswith(f"eh{self.tag}-")]
        links = _ip("-o", "link", "show", check=False).stdout
        left += [name for name in (self.bridge, *(h.veth for h in self.hosts)) if f" {name}:" in links]
        left += [name for name in (h.veth for h in self.hosts) if f" {name}@" in links]
        return left


def remove_tagged(tag: str) -> list[str]:
    """Remove what a ``Topology`` with this tag left behind when its owner died before ``destroy``
    (killed by a test's timeout): kill what runs in its namespaces, delete them and the bridge.
    Returns what was removed."""
    topo = Topology(tag=tag)
    existing = _ip("netns", "list", check=False).stdout.split()
    topo._namespaces = [n for n in existing if n.startswith(f"eh{tag}-")]
    links = _ip("-o", "link", "show", check=False).stdout
    topo._bridge_created = f" {topo.bridge}:" in links
    removed = [*topo._namespaces, *([topo.bridge] if topo._bridge_created else [])]
    topo.destroy()
    return removed


class BridgeEtcd(EtcdServer):
    """A single etcd in the root namespace whose clients reach it on ``host`` (the bridge address).

    Its peer port stays on loopback: it is a one-member cluster.
    """

    def __init__(self, workdir: Path, host: str, name: str = "netns") -> None:
        super().__init__(workdir, name)
        self.host = host
        self.client_port = free_port(host)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def argv(self) -> list[str]:
        argv = super().argv()
        client = f"http://{self.endpoint}"
        for flag in ("--listen-client-urls", "--advertise-client-urls"):
            argv[argv.index(flag) + 1] = client
        return argv


@dataclass
class NetnsDaemon(DaemonProc):
    """An ``elasticd`` started inside a network namespace; its control socket is a file, so the
    test (in the root namespace) talks to it as to any other daemon."""

    netns: str = ""

    def launcher(self) -> list[str]:
        # `ip netns exec` execs the command: the pid is the daemon's, and signals reach it.
        return ["ip", "netns", "exec", self.netns]

    def port_filter(self) -> str:
        # The namespace's nftables tables are its own: the filter is on, as in production.
        return "--port-filter"


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (e.g. a test's tmp dir)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or ())
            if proc.pid != me and text in cmdline and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found
