"""Which changes the daemon's watch delivers wake its agents and its scan (``JobManager.wake``).

No node's record reaches the watch (``Keys.watched``): a node's loss reaches a job's agents from
that job's presences (``manager/presence.py``), and its record is read on demand.

Pure; the agent simulation (``tests/agent_sim_node.py``) routes its wake-ups through the same
rules, so what it proves holds for the daemon's wake-ups.
"""

from __future__ import annotations

from elasticd.etcd.keyref import KeyKind

# Only these can change whether this node should join a job (or whether a job needs clean-up);
# a job's presences wake its agents only.
SCAN_KINDS = frozenset({KeyKind.SPEC, KeyKind.ROUND, KeyKind.FINAL, KeyKind.RESULT, KeyKind.JOB_DRAIN})
# The event history (elasticd.history) changes nothing any job or scan acts on.
QUIET_KINDS = frozenset({KeyKind.EVENT, KeyKind.EVENT_SEQ})
