"""Which changes the daemon's watch delivers wake its agents and its scan (``JobManager.wake``).

Pure; the agent simulation (``tests/agent_sim_node.py``) routes its wake-ups through the same
rules, so what it proves holds for the daemon's wake-ups.
"""

from __future__ import annotations

from elasticd.etcd.keys import Change, KeyKind

# Only these can change whether this node should join a job (or whether a job needs clean-up).
SCAN_KINDS = frozenset({KeyKind.SPEC, KeyKind.ROUND, KeyKind.FINAL, KeyKind.RESULT, KeyKind.JOB_DRAIN})
# The event history (elasticd.events) changes nothing any job or scan acts on.
QUIET_KINDS = frozenset({KeyKind.EVENT, KeyKind.EVENT_SEQ})


class NodeWakes:
    """Which changes of ``nodes/<node>`` records wake anyone: a node's record appearing (a node
    that this daemon has not seen live since its watch was armed) and its removal (its lease
    ended: a member may be lost), not a rewrite of a live node's record.

    A node rewrites its record when its free slots change, i.e. whenever it is admitted to a job
    or leaves one. What a record says besides the node being alive is read, when needed, by a
    read (``submit``'s capacity check); no agent's step and no scan acts on it. Waking every agent
    and scan of every daemon on each rewrite made admitting N nodes to one job cost N² wake-ups,
    each a read of the job (the scan's, of every job)."""

    def __init__(self) -> None:
        self._live: set[str] = set()

    def wakes(self, change: Change) -> bool:
        if change.kind is not KeyKind.NODE or change.ref is None:
            return True
        node = change.ref.node
        if change.deleted:
            self._live.discard(node)
            return True
        if node in self._live:
            return False
        self._live.add(node)
        return True

    def forget(self) -> None:
        """The watch was re-armed: what it missed meanwhile is unknown, so every node is new again."""
        self._live.clear()


# The keys under ``jobs/`` that ``JobStore.create`` writes (the full spec, ``specs/``, is unwatched).
CREATED_KINDS = frozenset({KeyKind.SPEC, KeyKind.ROUND, KeyKind.RESTARTS})


class Created:
    """A job this node's submit created, and the news of its keys the watch has not yet given:
    that news is the submitter's own write, which it reads back itself (``JobManager.advance``),
    so it drops no recent read; a later change of the same keys does, as any other."""

    def __init__(self) -> None:
        self.unheard = set(CREATED_KINDS)

    def own(self, change: Change) -> bool:
        """Whether ``change`` is the first news of a key the submit wrote (not a later change)."""
        if change.deleted or change.kind not in self.unheard:
            return False
        self.unheard.discard(change.kind)
        return True
