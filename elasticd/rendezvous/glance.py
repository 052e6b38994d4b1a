"""What an agent holds of a job besides its snapshot: a glance, and the revisions it saw.

``Glance`` is the small read a node waiting in an open round makes instead of a full
``JobSnapshot`` (O(1), not O(N)); ``Seen`` is the round and restart counter as a caller saw them,
which guard its bump. Pure: no etcd client (``elasticd.rendezvous.store`` does the reading)."""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.decode import DecodeError, parse_json
from elasticd.etcd.types import KeyValue
from elasticd.rendezvous.model import Join, RoundInfo
from elasticd.rendezvous.snapshot import JobSnapshot


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

    @classmethod
    def parse(
        cls, round_kv: KeyValue | None, final: bool, closed: bool, oldest: KeyValue | None, joined: bool
    ) -> Glance:
        try:
            info = RoundInfo.from_json(parse_json(round_kv.value)) if round_kv else None
            lead = Join.from_json(parse_json(oldest.value)).node if oldest else None
        except DecodeError:  # not quiet: the full read that follows reports the bad key
            return cls(-1, False, False, None, False)
        return cls(info.round if info else -1, final, closed, lead, joined)


@dataclass(frozen=True)
class Seen:
    """The revisions a bump is guarded by: the round and restart counter as the caller saw them."""

    round_mod: int
    restarts_mod: int
    restarts: int

    @classmethod
    def of(cls, snap: JobSnapshot) -> Seen:
        return cls(snap.round_mod, snap.restarts_mod, snap.restarts)
