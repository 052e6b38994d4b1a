"""What one job tells the node's port filter (``elasticd.portfilter``): its uid, the addresses of
its current members (read from etcd: untrusted, validated by ``rules.parse_members``) and the
listener known in advance, the store on ``MASTER_PORT`` where it listens here
(``agentstore.store_address``)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from elasticd import log
from elasticd.portfilter.rules import Address, Guard, parse_members
from elasticd.rendezvous.model import Member

_log = log.get("elasticd.portfilter")


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:  # a name: the listener is learned from its first answer instead
        return None


def guard_of(job: str, uid: int, members: Iterable[Member], address: str, ports: Iterable[int]) -> Guard:
    """The job's guard for one round: ``members`` its round's members (empty before the first),
    ``ports`` the listeners at ``address`` known now (the store's)."""
    kept, refused = parse_members(m.address for m in members)
    if refused:
        _log.warning("portfilter.members_refused", job=job, refused=list(refused[:8]), count=len(refused))
    here = _address(address)
    listeners = frozenset((here, p) for p in ports if here is not None and 0 < p <= 65535)
    return Guard(job, uid, kept, listeners)
