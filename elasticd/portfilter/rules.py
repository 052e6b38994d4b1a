"""Pure: the packet filter that keeps a job's ports to the job, as one nftables table.

What the table says, per user U who has a job on this node (root's jobs are never filtered: a rule
on uid 0 would filter the daemon, etcd and sshd too):

- output, sockets of U (``meta skuid``; a SYN-ACK is counted as its listener's): a SYN sent by U
  puts its (address, port) in ``c4_U`` (a short-lived set of U's own connects); a SYN-ACK sent by
  U puts its listener's (address, port) in ``l4_U`` (U's listeners, learned as they answer, and
  the store's, known in advance). A SYN-ACK over loopback goes out only to one of U's own
  connects; a packet of U's listeners to another host goes out only to a member's address.
- input: a SYN over loopback to one of U's listeners from anything but U's own connect is
  refused at once (``reject with tcp reset``: ECONNREFUSED); any packet from another host to one
  of U's listeners is refused unless it comes from a member's address (an established connection
  of a node that left is reset, which fences it).

The identity is the uid: every socket of U, in or out of a job, is U's. The job's cgroup would tell
jobs apart, and the kernel can match it (tried on 6.18 with a hybrid host's unified hierarchy at
/sys/fs/cgroup/unified: in the input hook, ``socket cgroupv2 level N "unified/<path>"`` finds a
SYN's listener and matches its cgroup; in the output hook a SYN-ACK carries a request socket,
which it never matches, so the rules would sit in the input hook). It is not used, because:
nftables 1.0.6's JSON, which this table is written in (libnftables and ``nft -j`` alike), refuses
the expression ("Invalid socket key value"; only nft's text syntax takes it, so the table would
have to be rendered as text); nft resolves the path to the directory's inode when the rule is
loaded, and the tracking cgroup of a job without a warm parent is removed at each group's stop
and made again at the next, so its rules would match nothing from then on, silently, unless
reloaded at every round with the inode compared; and a rule naming a directory that is gone
fails the whole transaction, every job's rules with it.
The member set of U is the union of the members of U's jobs here. The rules per user are a fixed
number; members and listeners are set elements, bounded (``MAX_MEMBERS``, the sets' ``size``).

``commands`` renders the whole table as one ``nft -j`` batch: the table created, deleted and
created again (so one transaction replaces it whole, whatever was there), then its sets, chains
and rules. Nothing outside the table is named.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

TABLE = "elasticd"  # the only table elasticd writes: family inet
FAMILY = "inet"
MAX_MEMBERS = 4096  # member addresses kept per job; more is a bad record, cut and logged
CLIENTS_TIMEOUT_S = 10  # a SYN and its SYN-ACK are microseconds apart on loopback; retransmits renew
LISTEN_TIMEOUT_S = 3600  # a listener unused this long is forgotten (its next answer learns it again)
SET_SIZE = 65536  # per set: elements past it are not added (a connect then waits on its retransmit)
LOOPBACK = "lo"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Json = dict[str, Any]


class Mode(Enum):
    """Whether this node filters its jobs' ports. Fixed at the daemon's start (``guard.detect``)."""

    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class Guard:
    """One job on this node as the filter sees it: whose sockets, which member addresses reach
    them, and the listeners known before any answer (the store's)."""

    job: str
    uid: int
    members: frozenset[Address] = frozenset()
    listeners: frozenset[tuple[Address, int]] = frozenset()


@dataclass(frozen=True)
class UserRules:
    """What one user's jobs here need of the table."""

    uid: int
    members: frozenset[Address]
    listeners: frozenset[tuple[Address, int]]


@dataclass(frozen=True)
class Ruleset:
    users: tuple[UserRules, ...]

    @property
    def empty(self) -> bool:
        return not self.users


def parse_members(addresses: Iterable[object]) -> tuple[frozenset[Address], tuple[str, ...]]:
    """Member addresses as read from etcd (untrusted): the valid ones, at most ``MAX_MEMBERS``,
    and what was refused (each as at most 80 characters). A name is refused: the filter matches
    addresses, and resolving one would trust whatever the resolver says."""
    kept: set[Address] = set()
    refused: list[str] = []
    for raw in addresses:
        try:
            if not isinstance(raw, str) or len(raw) > 64:
                raise ValueError
            addr = ipaddress.ip_address(raw)
        except ValueError:
            refused.append(repr(raw)[:80])
            continue
        if addr.is_unspecified or addr.is_multicast:
            refused.append(str(addr))
        elif len(kept) < MAX_MEMBERS:
            kept.add(addr)
        else:
            refused.append(f"{addr} (past {MAX_MEMBERS})")
    return frozenset(kept), tuple(refused)


def desired(guards: Mapping[str, Guard]) -> Ruleset:
    """The table for the jobs this daemon owns: one ``UserRules`` per non-root uid, in uid order."""
    by_uid: dict[int, tuple[set[Address], set[tuple[Address, int]]]] = {}
    for guard in guards.values():
        if guard.uid <= 0:
            continue
        members, listeners = by_uid.setdefault(guard.uid, (set(), set()))
        members |= guard.members
        listeners |= guard.listeners
    return Ruleset(
        tuple(UserRules(uid, frozenset(m), frozenset(ls)) for uid, (m, ls) in sorted(by_uid.items()))
    )


# --- rendering: nft's JSON ------------------------------------------------------------------------


def _ip(version: int) -> str:
    return "ip" if version == 4 else "ip6"


def _payload(protocol: str, name: str) -> Json:
    return {"payload": {"protocol": protocol, "field": name}}


def _pair(version: int, end: str) -> Json:
    """``ip saddr . tcp sport`` (``end`` "s") or ``ip daddr . tcp dport`` ("d")."""
    return {"concat": [_payload(_ip(version), f"{end}addr"), _payload("tcp", f"{end}port")]}


def _match(left: Any, right: Any, op: str = "==") -> Json:
    return {"match": {"op": op, "left": left, "right": right}}


def _flags(*set_: str) -> Json:
    """``tcp flags & (syn|ack) == set_``: a SYN alone, or a SYN-ACK."""
    return _match({"&": [_payload("tcp", "flags"), ["syn", "ack"]]}, list(set_) if len(set_) > 1 else set_[0])


def _iface(hook: str, loopback: bool) -> Json:
    key = "iifname" if hook == "input" else "oifname"
    return _match({"meta": {"key": key}}, LOOPBACK, "==" if loopback else "!=")


def _update(set_name: str, version: int, end: str) -> Json:
    return {"set": {"op": "update", "elem": _pair(version, end), "set": f"@{set_name}"}}


def _rule(chain: str, *expr: Json) -> Json:
    return {"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "expr": list(expr)}}}


def names(uid: int, version: int) -> tuple[str, str, str]:
    """The user's sets for one IP version: own connects, listeners, member addresses."""
    return f"c{version}_{uid}", f"l{version}_{uid}", f"m{version}_{uid}"


def _sets(user: UserRules, version: int) -> list[Json]:
    clients, listen, members = names(user.uid, version)
    kind = "ipv4_addr" if version == 4 else "ipv6_addr"
    base = {"family": FAMILY, "table": TABLE, "size": SET_SIZE}
    mine = sorted((a, p) for a, p in user.listeners if a.version == version)
    listen_set = base | {
        "name": listen,
        "type": [kind, "inet_service"],
        "flags": ["timeout"],
        "timeout": LISTEN_TIMEOUT_S,
    }
    if mine:
        listen_set["elem"] = [{"concat": [str(a), p]} for a, p in mine]
    member_set = base | {"name": members, "type": kind}
    addrs = sorted(str(a) for a in user.members if a.version == version)
    if addrs:
        member_set["elem"] = addrs
    return [
        {
            "add": {
                "set": base
                | {
                    "name": clients,
                    "type": [kind, "inet_service"],
                    "flags": ["timeout"],
                    "timeout": CLIENTS_TIMEOUT_S,
                }
            }
        },
        {"add": {"set": listen_set}},
        {"add": {"set": member_set}},
    ]


def _user_out(user: UserRules, version: int) -> list[Json]:
    """The user's output rules for one IP version (its chain ``out_<uid>``)."""
    clients, listen, members = names(user.uid, version)
    chain = f"out_{user.uid}"
    sport = _pair(version, "s")
    return [
        _rule(
            chain,
            _match(_payload(_ip(version), "version"), version),
            _flags("syn"),
            _update(clients, version, "s"),
        ),
        _rule(
            chain,
            _match(_payload(_ip(version), "version"), version),
            _flags("syn", "ack"),
            _update(listen, version, "s"),
        ),
        _rule(
            chain,
            _iface("output", True),
            _flags("syn", "ack"),
            _match(_pair(version, "d"), f"@{clients}"),
            {"accept": None},
        ),
        _rule(
            chain,
            _iface("output", False),
            _match(sport, f"@{listen}"),
            _match(_payload(_ip(version), "daddr"), f"@{members}"),
            _update(listen, version, "s"),
            {"accept": None},
        ),
        _rule(chain, _iface("output", False), _match(sport, f"@{listen}"), {"drop": None}),
    ]


def _user_in(user: UserRules, version: int) -> list[Json]:
    """The user's rules in the input chain, for one IP version."""
    clients, listen, members = names(user.uid, version)
    reset = {"reject": {"type": "tcp reset"}}
    dport = _pair(version, "d")
    return [
        _rule(
            "input",
            _iface("input", True),
            _flags("syn"),
            _match(dport, f"@{listen}"),
            _match(_pair(version, "s"), f"@{clients}", "!="),
            reset,
        ),
        _rule(
            "input",
            _iface("input", False),
            _match(dport, f"@{listen}"),
            _match(_payload(_ip(version), "saddr"), f"@{members}", "!="),
            reset,
        ),
    ]


def _base_chain(name: str, hook: str) -> Json:
    return {
        "add": {
            "chain": {
                "family": FAMILY,
                "table": TABLE,
                "name": name,
                "type": "filter",
                "hook": hook,
                "prio": 0,
                "policy": "accept",
            }
        }
    }


def commands(ruleset: Ruleset) -> list[Json]:
    """The batch that makes the table say ``ruleset`` (an empty ruleset: no table at all)."""
    table = {"family": FAMILY, "name": TABLE}
    batch: list[Json] = [{"add": {"table": table}}, {"delete": {"table": table}}]
    if ruleset.empty:
        return batch
    batch += [{"add": {"table": table}}, _base_chain("input", "input"), _base_chain("output", "output")]
    for user in ruleset.users:
        chain = f"out_{user.uid}"
        batch += _sets(user, 4) + _sets(user, 6)
        batch.append({"add": {"chain": {"family": FAMILY, "table": TABLE, "name": chain}}})
        batch.append(
            _rule("output", _match({"meta": {"key": "skuid"}}, user.uid), {"jump": {"target": chain}})
        )
        batch += _user_out(user, 4) + _user_out(user, 6)
        batch.append(_rule(chain, _iface("output", True), _flags("syn", "ack"), {"drop": None}))
        batch += _user_in(user, 4) + _user_in(user, 6)
    return batch


def rule_count(batch: Iterable[Json]) -> int:
    """How many rules a batch adds (the figure the bench reports per job)."""
    return sum(1 for cmd in batch if "rule" in cmd.get("add", {}))
