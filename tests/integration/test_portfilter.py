"""The port filter as an attacker meets it: real nft, real users on loopback, network namespaces
as a member node and a stranger. A refusal is observed as ECONNREFUSED (the filter resets), never
as a wait that ran out."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator

import pytest

from elasticd.netaddr import free_port
from elasticd.portfilter.guard import PortFilter
from elasticd.portfilter.nft import NftCli
from elasticd.portfilter.rules import Guard, Mode
from tests.support import wait_for

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: users, namespaces and nft"),
    pytest.mark.skipif(NftCli.find() is None, reason="no nft binary: apt-get install nftables"),
    pytest.mark.xdist_group("nft"),  # one table per host: its tests run one at a time
]
A = ipaddress.ip_address
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
CONNECT = """
import socket, sys
s = socket.socket(); s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("connected")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e)
"""
LISTEN = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(64); print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


@pytest.fixture
def users() -> Iterator[tuple[int, int]]:
    names = [f"epf{os.getpid() % 100000}{x}" for x in "ab"]
    for n in names:
        _sh("useradd", "-M", "-s", "/usr/sbin/nologin", n)
    try:
        yield pwd.getpwnam(names[0]).pw_uid, pwd.getpwnam(names[1]).pw_uid
    finally:
        for n in names:  # a test elsewhere may hold /etc/passwd's lock a moment: try again
            wait_for(functools.partial(_userdel, n), 30, 0.5, f"userdel {n}")


def _userdel(name: str) -> bool:
    done = subprocess.run(["userdel", name], capture_output=True, timeout=20)
    return done.returncode in (0, 6)  # 6: no such user (gone already)


@pytest.fixture
def namespaces() -> Iterator[dict[str, tuple[str, str]]]:
    """Two namespaces, each behind its own veth: ``member`` and ``stranger``; name -> (its
    address, the host's address it reaches)."""
    tag = os.getpid() % 10000
    nets = {"member": ("10.231.0.2", "10.231.0.1"), "stranger": ("10.231.1.2", "10.231.1.1")}
    made: list[str] = []
    try:
        for i, (role, (theirs, ours)) in enumerate(nets.items()):
            ns, host_if = f"epf{tag}{role[0]}", f"epf{tag}h{i}"
            _sh("ip", "netns", "add", ns)
            made.append(ns)
            _sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "addr", "add", f"{ours}/30", "dev", host_if)
            _sh("ip", "link", "set", host_if, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{theirs}/30", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield {role: (theirs, ours) for role, (theirs, ours) in nets.items()} | {"_ns": (made[0], made[1])}
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def connect(host: str, port: int, uid: int = 0, netns: str = "") -> str:
    argv = [PY, "-c", CONNECT, host, str(port)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=15, user=uid or None)
    return done.stdout.strip()


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def table_exists() -> bool:
    return subprocess.run(["nft", "list", "table", "inet", "elasticd"], capture_output=True).returncode == 0


@contextlib.contextmanager
def listening(port: int, user: int) -> Iterator[None]:
    """A TCP listener on every address, as ``user``, until the block ends."""
    listener = subprocess.Popen([PY, "-c", LISTEN, str(port)], user=user, stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        yield
    finally:
        listener.kill()
        listener.wait(10)


@contextlib.contextmanager
def filtering() -> Iterator[PortFilter]:
    """A started port filter through the real ``nft``, closed when the block ends."""
    nft = NftCli.find()
    assert nft is not None
    pf = PortFilter(nft, Mode.ON)
    run(pf.start())
    try:
        yield pf
    finally:
        run(pf.close())


def test_only_the_jobs_user_and_its_members_reach_its_ports(
    users: tuple[int, int], namespaces: dict[str, tuple[str, str]]
) -> None:
    owner, other = users
    member_ns, stranger_ns = namespaces["_ns"]
    port = free_port("0.0.0.0")
    with listening(port, owner), filtering() as pf:
        member, host_m = namespaces["member"]
        _, host_s = namespaces["stranger"]
        known = frozenset({(A("127.0.0.1"), port), (A(host_m), port), (A(host_s), port)})
        run(pf.admit(Guard("job1", owner, frozenset({A(member)}), known)))
        assert connect("127.0.0.1", port, owner) == "connected"  # the job's own processes
        assert connect("127.0.0.1", port, other) == "refused"  # another local user
        assert connect("127.0.0.1", port) == "refused"  # root's processes are not the job's either
        assert connect(host_m, port, netns=member_ns) == "connected"  # a member node
        assert connect(host_s, port, netns=stranger_ns) == "refused"  # a stranger's host
        run(pf.admit(Guard("job1", owner, frozenset(), known)))  # the member left the job
        assert connect(host_m, port, netns=member_ns) == "refused"
        assert connect("127.0.0.1", port, owner) == "connected"
        run(pf.release("job1"))
        assert not table_exists()
        assert connect("127.0.0.1", port, other) == "connected"  # no rule outlives the job
    assert not table_exists()


def test_a_listener_not_known_in_advance_is_learned_from_its_first_answer(users: tuple[int, int]) -> None:
    owner, other = users
    port = free_port("0.0.0.0")
    with listening(port, owner), filtering() as pf:
        run(pf.admit(Guard("job2", owner)))  # a gloo-like listener the daemon never heard of
        assert connect("127.0.0.1", port, other) == "refused"  # its answer dropped, the retry reset
        assert connect("127.0.0.1", port, owner) == "connected"
        assert connect("127.0.0.1", port, other) == "refused"
    assert not table_exists()


def test_a_new_daemon_removes_what_a_killed_one_left(users: tuple[int, int]) -> None:
    owner, _ = users
    nft = NftCli.find()
    assert nft is not None
    left = PortFilter(nft, Mode.ON)
    run(left.admit(Guard("job3", owner)))  # and never closed: as after a SIGKILL
    assert table_exists()
    run(PortFilter(nft, Mode.ON).start())
    assert not table_exists()
