"""What an agent holds of a job besides its full read: a glance, and the revisions it saw.

``Glance`` is the small read a node waiting in an open round makes instead of a full read of
the job (``jobread``: O(1), not O(N)); ``Seen`` is the round and restart counter as a caller saw them,
which guard its bump. Pure: no etcd client (``elasticd.rendezvous.storeread`` does the reading)."""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.decode import DecodeError, decode, parse_json
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.types import KeyValue
from elasticd.rendezvous.jobread import JobRead
from elasticd.rendezvous.model import Join, LeadRecord, RoundInfo

# A glance's leader when the reader's own join found others before it and no lead key named
# the leader yet: someone older leads (not a node id: it never equals one).
AN_OLDER_JOIN = "(an older join)"


@dataclass(frozen=True)
class Glance:
    """What a node waiting in an open round needs, read in one small request (O(1), not O(N))."""

    round: int
    ended: bool
    closed: bool
    leader: str | None
    joined: bool

    def quiet(self, round_no: int, node: str) -> bool:
        """Nothing for ``node`` to do yet: the round is open, it joined, someone else leads."""
        return (
            self.round == round_no
            and not self.ended
            and not self.closed
            and self.joined
            and self.leader != node
        )

    @staticmethod
    def lead_of(keys: Keys, kv: KeyValue) -> str | DecodeError:
        """The node a lead key names (``Keys.lead``), or why it is no lead key."""
        try:
            ref = keys.parse(kv.key)
            decode(LeadRecord, parse_json(kv.value))
        except DecodeError as exc:
            return exc
        return ref.node if ref.kind is KeyKind.LEAD and ref.node else DecodeError("", "not a lead key")

    @staticmethod
    def join_of(kv: KeyValue) -> str | DecodeError:
        """The node a join names (the round's oldest: its leader while none claimed it)."""
        try:
            return Join.from_json(parse_json(kv.value)).node
        except DecodeError as exc:
            return exc

    @classmethod
    def parse(
        cls,
        round_kv: KeyValue | None,
        final: bool,
        closed: bool,
        leader: str | DecodeError | None,
        joined: bool,
    ) -> Glance:
        try:
            info = RoundInfo.from_json(parse_json(round_kv.value)) if round_kv else None
        except DecodeError:
            info = None
        if isinstance(leader, DecodeError) or (round_kv and info is None):
            return cls(-1, False, False, None, False)  # not quiet: the full read reports the bad key
        return cls(info.round if info else -1, final, closed, leader, joined)


@dataclass(frozen=True)
class Seen:
    """The revisions a bump is guarded by: the round and restart counter as the caller saw them."""

    round_mod: int
    restarts_mod: int
    restarts: int

    @classmethod
    def of(cls, read: JobRead) -> Seen:
        return cls(read.round_mod, read.restarts_mod, read.restarts)
