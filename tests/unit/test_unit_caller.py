"""elasticd.control.commands.base.Caller: identity from libzmq's IPC peer credentials."""

from __future__ import annotations

import os
import pwd

import pytest

from elasticd.control.commands.base import Command
from elasticd.manager.access import Access, Caller
from elasticd.wire import NoArgs


@pytest.mark.parametrize(
    ("peer", "caller"),
    [
        ("localhost:1000:1000:4242", Caller(1000, 1000, 4242)),
        ("localhost:0:0:1", Caller(0, 0, 1)),
        ("host.example.com:1001:100:77", Caller(1001, 100, 77)),
        ("a:b:1:2:3", Caller(1, 2, 3)),  # only the last three fields are credentials
        ("[::1]:5:6:7", Caller(5, 6, 7)),
    ],
)
def test_from_peer_address(peer: str, caller: Caller) -> None:
    assert Caller.from_peer_address(peer) == caller


@pytest.mark.parametrize(
    "peer",
    [
        None,
        "",
        "localhost",
        "localhost:1000",
        "localhost:1000:1000",
        "1000:1000:4242",
        "localhost:x:1000:4242",
        "localhost:1000:1000:pid",
        "localhost::1000:4242",
        "localhost:1000:1000:",
        "localhost:1.5:1000:4242",
        "localhost: 1:2:3",
    ],
)
def test_from_peer_address_rejects(peer: str | None) -> None:
    assert Caller.from_peer_address(peer) is None


@pytest.mark.parametrize("peer", ["localhost:--1:0:1", "localhost:1:\u00b2:1"])
def test_from_peer_address_odd_digits(peer: str) -> None:
    assert Caller.from_peer_address(peer) is None


def test_user_name() -> None:
    me = os.getuid()
    assert Caller(me, 0, 1).user == pwd.getpwuid(me).pw_name


def test_user_name_of_unknown_uid_is_the_number() -> None:
    uid = 3_999_999
    try:
        pwd.getpwuid(uid)
        pytest.skip("uid exists on this host")
    except KeyError:
        pass
    assert Caller(uid, 0, 1).user == str(uid)


async def _handler(daemon: object, args: NoArgs, caller: Caller) -> None:
    """Say hello.

    More text.
    """


async def _undocumented(daemon: object, args: NoArgs, caller: Caller) -> None:
    pass


def test_command_help_is_first_docstring_line() -> None:
    assert Command("hello", NoArgs, _handler, Access.CONNECTED).help == "Say hello."
    assert Command("x", NoArgs, _undocumented, Access.CONNECTED).help == ""
