"""``jobs.agentstore``: whether a round's ranks are clients of a store host (torchrun's
``TORCHELASTIC_USE_AGENT_STORE=True``) or rank 0 hosts the store; and the store host's wire."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticd.jobs.agentstore import (
    LOOPBACK,
    Choice,
    at_join,
    at_start,
    named_port_refusal,
    offered_again,
    store_address,
)
from elasticd.netaddr import free_port, listen_error
from elasticd.workers.warm import messages as wire
from elasticd.workers.warm import spawn, storehost
from elasticd.workers.warm import zygote as zy
from elasticd.workers.zygote_program import boot
from elasticd.workers.zygote_program import storehost as storehost_program
from tests.fakes import FAKE_ZYGOTE_HEAD, READY, NoReaper, until

SERVES, RANK0 = Choice(True, "store host"), Choice(False, "rank 0 hosts")


@given(
    leads=st.booleans(),
    chosen=st.sampled_from([SERVES, RANK0]),
    serving=st.none() | st.just("it has ended"),
    listen=st.none() | st.just("Address already in use"),
)
def test_a_picked_port_is_never_refused_nor_a_named_one_on_a_node_that_does_not_lead(
    leads: bool, chosen: Choice, serving: str | None, listen: str | None
) -> None:
    assert named_port_refusal(None, leads, chosen, serving, listen) is None
    assert named_port_refusal(29500, False, chosen, serving, listen) is None


def test_a_named_port_is_served_by_the_store_host_or_by_rank_0_else_the_job_is_refused() -> None:
    assert named_port_refusal(29500, True, SERVES, None, None) is None
    assert named_port_refusal(29500, True, RANK0, "no warm parent", None) is None  # rank 0 listens
    assert named_port_refusal(29500, True, SERVES, "it has ended", None) == (
        "--master-port 29500 has no store host: it has ended"
    )
    assert named_port_refusal(29500, True, RANK0, "in use", "Address already in use") == (
        "--master-port 29500 cannot be listened on: Address already in use"
    )


def test_the_named_port_is_probed_as_a_store_binds_it() -> None:
    with socket.create_server(("0.0.0.0", 0)) as taken:
        assert listen_error(taken.getsockname()[1]) is not None
    assert listen_error(free_port()) is None


def test_a_node_with_a_listening_store_host_offers_it() -> None:
    assert at_join(None, None).agent_store


@pytest.mark.parametrize(
    ("cold", "failed", "said"),
    [("off (--no-warm)", None, "--no-warm"), ("zygote unavailable: import x", None, "import x"),
     (None, "OSError: address in use", "address in use")],
)  # fmt: skip
def test_without_a_warm_parent_or_a_store_host_rank_0_hosts(
    cold: str | None, failed: str | None, said: str
) -> None:
    choice = at_join(cold, failed)
    assert not choice.agent_store and said in choice.why and "no store host" in choice.why


@given(st.booleans(), st.one_of(st.none(), st.text(max_size=20)))
def test_a_round_of_several_nodes_whose_leader_offered_no_store_host_is_rank_0_hosted(
    leads: bool, serving: str | None
) -> None:
    assert not at_start(False, leads, False, serving).agent_store


@given(st.booleans())
def test_members_of_a_round_of_several_nodes_follow_the_leaders_offer(leads: bool) -> None:
    assert at_start(True, leads, False, None).agent_store  # a serving leader, or any follower
    assert at_start(True, False, False, "gone").agent_store  # only the leader knows its host


@given(st.booleans(), st.booleans())
def test_a_round_of_one_node_decides_at_the_start(advertised: bool, leads: bool) -> None:
    """Its join may have come before the zygote was ready: no other node was told anything."""
    assert at_start(advertised, leads, True, None).agent_store
    alone = at_start(advertised, leads, True, "it has ended")
    assert not alone.agent_store and "rank 0 hosts" in alone.why


def test_a_leader_whose_store_host_is_gone_cannot_take_back_what_other_nodes_were_told() -> None:
    shared = at_start(True, True, False, "it has ended")
    assert shared.agent_store and "find no store" in shared.why


@given(st.booleans())
def test_a_store_host_that_served_a_round_of_several_nodes_is_never_offered_again(alive: bool) -> None:
    """Ranks of that round elsewhere may still run and write into the next round's keys."""
    assert not offered_again(alive, served_peers=True)
    assert offered_again(True, served_peers=False) and not offered_again(False, served_peers=False)


# --- the store host's wire -------------------------------------------------------------------------


@pytest.mark.parametrize("node", ["10.0.0.5", "fd00::5", "node-a.example"])
def test_a_job_of_one_node_for_life_serves_its_store_on_loopback_and_one_that_may_grow_on_the_node(
    node: str,
) -> None:
    assert store_address(node, 1) == LOOPBACK
    assert store_address(node, 2) == node  # the other members reach it there
    assert store_address("127.0.0.1", 1) == "127.0.0.1"
    assert store_address("::1", 1) == "::1"  # already loopback: as the node says
    assert store_address("localhost", 1) == LOOPBACK


def test_a_store_request_is_parsed_with_its_socket_alone() -> None:
    data = json.dumps({"op": "store", "id": 4, "host": "10.0.0.1", "port": 29500, "fds": ["ctl"]}).encode()
    assert boot.parse_op(data, 1) == {
        "op": "store",
        "id": 4,
        "host": "10.0.0.1",
        "port": 29500,
        "fds": ["ctl"],
    }


@pytest.mark.parametrize(
    ("change", "nfds"),
    [({}, 0), ({}, 2), ({"fds": ["log"]}, 1), ({"port": 70000}, 1), ({"port": "1"}, 1), ({"host": ""}, 1),
     ({"host": 5}, 1), ({"id": -1}, 1)],
)  # fmt: skip
def test_a_bad_store_request_is_refused(change: dict[str, Any], nfds: int) -> None:
    req = {"op": "store", "id": 4, "host": "h", "port": 29500, "fds": ["ctl"]} | change
    with pytest.raises(boot.BadRequest):
        boot.parse_op(json.dumps(req).encode(), nfds)


def test_a_clear_request_names_its_attempt() -> None:
    assert storehost_program.parse_clear(b'{"op": "clear", "attempt": 3}') == 3
    for bad in (b"x", b"[]", b'{"op": "drop"}', b'{"op": "clear", "attempt": -1}', b'{"op": "clear"}'):
        with pytest.raises(storehost_program.BadStoreRequest):
            storehost_program.parse_clear(bad)


def test_what_a_store_host_says_is_typed() -> None:
    assert wire.parse_store_message(b'{"ev": "listening", "pid": 9, "port": 29500}') == wire.Listening(
        9, 29500
    )
    assert wire.parse_store_message(b'{"ev": "cleared", "attempt": 1, "keys": 7}') == wire.Cleared(1, 7)
    failed = wire.parse_store_message(b'{"ev": "store_failed", "error": "' + b"x" * 900 + b'"}')
    assert failed == wire.StoreFailed("x" * 500)


@pytest.mark.parametrize(
    "data",
    [b"", b"[]", b'{"ev": "listening", "pid": 9, "port": 0}', b'{"ev": "listening", "pid": 1, "port": 5}',
     b'{"ev": "listening", "pid": 9, "port": "5"}', b'{"ev": "cleared", "attempt": true, "keys": 1}',
     b'{"ev": "ready", "pid": 9}', b"{" + b" " * 5000 + b"}"],
)  # fmt: skip
def test_garbage_from_a_store_host_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.parse_store_message(data)


# --- the daemon's side, against a fake zygote whose store host lies --------------------------------

LYING_HOST = (
    READY.replace("import_s=0.1", "import_s=0.1, torch=True")  # a zygote that imported torch
    + """
data, fds, _, _ = socket.recv_fds(ctl, 1 << 22, 8)
r = json.loads(data)
pid = fork()
if pid == 0:
    s = socket.socket(fileno=fds[0])
    s.send(json.dumps(SAYS | ({"pid": os.getpid()} if "pid" in SAYS else {})).encode())
    if SAYS["ev"] != "store_failed":  # a real one exits then; a liar lingers until it is killed
        time.sleep(60)
    os._exit(0)
os.close(fds[0])
send(ev='forked', id=r['id'], pid=pid)
_, status = os.waitpid(pid, 0)
send(ev='exit', pid=pid, status=status)
time.sleep(60)
"""
)


@pytest.mark.parametrize(
    ("says", "error"),
    [({"ev": "listening", "pid": 0, "port": 1}, "not that pid"),  # another port than asked
     ({"ev": "store_failed", "error": "EADDRINUSE"}, "EADDRINUSE")],
)  # fmt: skip
def test_a_store_host_that_does_not_listen_where_asked_is_stopped(
    tmp_path: Path, says: dict[str, Any], error: str
) -> None:
    setup = spawn.ZygoteSetup(
        "job-1", sys.executable, "script", "/s.py", str(tmp_path), dict(os.environ), None
    )
    source = FAKE_ZYGOTE_HEAD + f"SAYS = {says!r}\n" + LYING_HOST

    async def run() -> None:
        z = zy.Zygote(setup, NoReaper(), source=source.encode())  # type: ignore[arg-type]
        z.spawn()
        try:
            async with asyncio.timeout(30):
                assert await z.ready()
                with pytest.raises(storehost.StoreError, match=error):
                    await storehost.start(z, "127.0.0.1", 29999)
                await until(lambda: not z.helpers)  # ended, or stopped (a liar ignores its socket's end)
                assert z.usable  # the store host's lie is no reason to give up the zygote
        finally:
            await z.close()

    asyncio.run(run())


def test_a_zygote_without_torch_is_asked_for_no_store_host(tmp_path: Path) -> None:
    setup = spawn.ZygoteSetup(
        "job-1", sys.executable, "script", "/s.py", str(tmp_path), dict(os.environ), None
    )
    asked = (
        "data, fds, _, _ = socket.recv_fds(ctl, 1 << 22, 8)\nsend(ev='fork_failed', id=0, error='asked')\n"
    )
    source = FAKE_ZYGOTE_HEAD + READY + asked + "time.sleep(60)\n"

    async def run() -> None:
        z = zy.Zygote(setup, NoReaper(), source=source.encode())  # type: ignore[arg-type]
        z.spawn()
        try:
            async with asyncio.timeout(30):
                assert await z.ready() and not z.torch
                with pytest.raises(storehost.StoreError, match="no torch"):
                    await storehost.start(z, "127.0.0.1", 29999)
                assert z.usable and not z.helpers
        finally:
            await z.close()

    asyncio.run(run())
