"""The etcd key layout, in one place: build keys, parse them back, route watch events.

Every key elasticd writes is built here, and every key it reads or is told about by a watch is
parsed here into a ``KeyRef`` (see docs/architecture/etcd-keys.md). Parsing is strict: a key under
the prefix that has no meaning (an unknown kind, a bad job or node id, a round that is not a
plain decimal) raises ``DecodeError`` naming the part. Pure: no etcd client.

Every daemon watches what sorts before ``nodes/`` (``jobs/``, ``drain/``, ``gpus/``, ``history/``,
the janitor key: ``Keys.watched``) and ``notes/``, and holds a copy of ``jobs/`` and ``notes/``
(every job: the scan, the table of ``status``; ``manager/clustercopy.py``). What grows with a
job's nodes lives outside both, so a round of N nodes reaches each other daemon as O(1) bytes and
events, and is read only by those who need it, for one job, in pages:

- ``parts/<job>/<r>/{join,done}/<node>``: a member's join (under its lease) and done marker; the
  round's leader watches its joins, the admitter and the janitor count or ask about one node;
  ``parts/<job>/<r>/lead/<node>``: the leader's claim, under its join's lease, which a waiting
  member's glance reads (one key) instead of the oldest join (a sort of every join);
- ``reports/<job>/<node>``: a node's state, devices, pids and progress, rewritten at every step;
- ``rounds/<job>/<r>/<node>``: a member's assignment, written by the leader before the round's
  head (``jobs/<job>/rdzv/<r>/result``, a few hundred bytes whatever N);
- ``presence/<job>/<node>``: a node's presence (under its lease), whose deletion the job's agents
  alone watch; ``nodes/<node>``: its record, read on demand;
- ``specs/<job>``: the full spec, read only by a node about to take part (``jobs/<job>/spec``
  holds its small head, ``elasticd.terms.head``).

``notes/<job>/<node>`` (why an allowed node cannot take part) is in the copy of every job:
``status`` shows it; it is written only when it changes, and its news wakes no one.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.decode import DecodeError
from elasticd.etcd import eventkeys
from elasticd.etcd.eventkeys import EventRing
from elasticd.etcd.keyref import Change, KeyKind, KeyRef
from elasticd.etcd.kv import prefix_end
from elasticd.terms.ids import MAX_ROUND, valid_gpu_uuid, valid_job_id, valid_node_id

_JOB_LEAVES = {
    "spec": KeyKind.SPEC,
    "round": KeyKind.ROUND,
    "restarts": KeyKind.RESTARTS,
    "final": KeyKind.FINAL,
}
_NODE_KEYS = {
    "nodes": KeyKind.NODE,
    "drain": KeyKind.NODE_DRAIN,
    "checks": KeyKind.CHECK_REQUEST,
    "checked": KeyKind.CHECK_ANSWER,
}
_JOB_NODE_KEYS = {"waiting": KeyKind.WAITING, "drain": KeyKind.JOB_DRAIN}
_ROUND_NODE_KEYS = {"left": KeyKind.LEFT}
_PART_KINDS = {
    "join": KeyKind.JOIN,
    "done": KeyKind.DONE,
    "lead": KeyKind.LEAD,
}  # parts/<job>/<r>/<kind>/<node>
_NODE_TREES = {"reports": KeyKind.NODE_STATUS, "notes": KeyKind.PENDING}  # <tree>/<job>/<node>


@dataclass(frozen=True)
class Keys:
    # v2: joins, statuses and pending notes moved out of jobs/ into parts/ (v1 daemons would
    # neither see v2 joins nor read their own). v3: jobs/<job>/spec holds the job's head, and the
    # full spec moved to specs/<job> (a v2 daemon would read a head as an invalid spec). v4: a
    # round's result is a small head, and each member's part is its own record under rounds/ (a
    # v3 daemon would read a head as an invalid result). v5: each node's status moved out of
    # parts/ to reports/<job>/<node>, its pending note to notes/<job>/<node>, and the read of
    # every job leaves parts/ (the joins, and the done markers, which moved there from
    # jobs/<job>/rdzv/<r>/done/) out (a v4 daemon would see no v5 status, note or done marker,
    # nor a v5 daemon a v4 one). v6: a round's leader writes its lead key beside its join
    # (parts/<job>/<r>/lead/<node>), which a waiting member's glance reads instead of sorting
    # every join (a v5 daemon would read a lead key as an invalid record).
    prefix: str = "/elasticd/v6"

    # -- build ---------------------------------------------------------------------------------
    def nodes(self) -> str:
        return f"{self.prefix}/nodes/"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}/nodes/{node_id}"

    def janitor(self) -> str:
        return f"{self.prefix}/janitor"

    def jobs(self) -> str:
        return f"{self.prefix}/jobs/"

    def job(self, job_id: str) -> str:
        """Every record of the job but its parts (``job_parts``)."""
        return f"{self.prefix}/jobs/{job_id}/"

    def every_job(self) -> tuple[str, str]:
        """The prefixes the copy of every job holds (``ClusterCopy``: the scan, the table of
        ``status``): the jobs' records and their pending notes, and no member's key."""
        return self.jobs(), self.all_notes()

    def read_with_every_job(self, relative: str) -> bool:
        """Whether a key (relative to the prefix, as ``InvalidKey`` names it) is in the copy of
        every job: a bad one elsewhere (a join, an assignment) is seen only by a read of its job."""
        return f"{self.prefix}/{relative}".startswith(self.every_job())

    def job_parts(self, job_id: str) -> str:
        """The job's parts: its joins of every round."""
        return f"{self.prefix}/parts/{job_id}/"

    def job_notes(self, job_id: str) -> str:
        """The job's pending notes (``pending_note``)."""
        return f"{self.prefix}/notes/{job_id}/"

    def all_notes(self) -> str:
        """Every job's pending notes: held with every job (``ClusterCopy``)."""
        return f"{self.prefix}/notes/"

    def job_prefixes(self, job_id: str) -> tuple[str, str, str]:
        """Every key of the job: its parts and notes, then the rest (the order a removal deletes
        them in, so that an interrupted removal leaves no notes of a job that has no records,
        which the janitor would find in the read of every job and delete). The job's
        full spec (``job_body``), its rounds' assignments (``job_rounds``) and its nodes' reports
        (``job_reports``) go in the same transaction as the rest."""
        return self.job_parts(job_id), self.job_notes(job_id), self.job(job_id)

    def job_reports(self, job_id: str) -> str:
        """Every node's report of its part in the job (``node_status``): outside every read of
        every job; ``status <job>`` reads them in pages (``rendezvous/reportread.py``)."""
        return f"{self.prefix}/reports/{job_id}/"

    def all_reports(self) -> str:
        return f"{self.prefix}/reports/"

    def job_rounds(self, job_id: str) -> str:
        """The assignments of every round of the job that is kept (``assignment``)."""
        return f"{self.prefix}/rounds/{job_id}/"

    def all_rounds(self) -> str:
        """Every job's round assignments: unwatched, and outside the scan's read of every job; a
        member reads its own, ``status`` of one job those of the round it shows."""
        return f"{self.prefix}/rounds/"

    def job_joins(self, job_id: str) -> tuple[str, str]:
        """The range [start, end) of the job's joins and done markers, of every round: a round is
        a plain decimal, so its keys sort from ``0`` to ``:`` (the byte after ``9``)."""
        parts = self.job_parts(job_id)
        return parts + "0", parts + ":"

    def all_parts(self) -> str:
        """Every job's joins: the subtree no daemon watches (a round's leader watches its round's)
        and no read of every job covers."""
        return f"{self.prefix}/parts/"

    def presence(self, job_id: str, node: str) -> str:
        """``node`` is in the job: written under its lease before its first key of the job."""
        return f"{self.prefix}/presence/{job_id}/{node}"

    def presences(self, job_id: str) -> str:
        """The job's nodes: what its agents read as the live ones, and watch for deletions."""
        return f"{self.prefix}/presence/{job_id}/"

    def specs(self) -> str:
        """Every job's full spec: read by a node about to take part in the job, watched by none."""
        return f"{self.prefix}/specs/"

    def watched(self) -> tuple[tuple[str, str], ...]:
        """The ranges [start, end) every daemon watches: the whole prefix but the nodes' records,
        the jobs' notes and parts, the nodes' presences and reports, the rounds' assignments and the full
        specs. They are left out as one range (``nodes/`` to ``specs/``): the layout has no other
        key between them (``drain``, ``gpus``, ``janitor``, ``jobs``, ``events`` and
        ``event_seq`` sort before ``nodes/``), so one more watch stream is not needed."""
        return (
            (f"{self.prefix}/", self.nodes()),
            (prefix_end(self.specs()), prefix_end(f"{self.prefix}/")),
        )

    def job_spec(self, job_id: str) -> str:
        """The job's head (``elasticd.terms.head``): what every daemon reads of its spec."""
        return f"{self.prefix}/jobs/{job_id}/spec"

    def job_body(self, job_id: str) -> str:
        """The job's full spec, written and removed with its head."""
        return f"{self.prefix}/specs/{job_id}"

    def job_round(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/round"

    def job_restarts(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/restarts"

    def job_final(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/final"

    def join(self, job_id: str, round_no: int, node: str) -> str:
        return f"{self.prefix}/parts/{job_id}/{round_no}/join/{node}"

    def joins(self, job_id: str, round_no: int) -> str:
        """Round ``round_no``'s joins: what its leader watches."""
        return f"{self.prefix}/parts/{job_id}/{round_no}/join/"

    def lead(self, job_id: str, round_no: int, node: str) -> str:
        """``node`` leads round ``round_no``: written by the leader once a read of every join
        showed its own the oldest, guarded by that join and under its lease (``JobStore.claim_lead``)."""
        return f"{self.prefix}/parts/{job_id}/{round_no}/lead/{node}"

    def leads(self, job_id: str, round_no: int) -> str:
        """Round ``round_no``'s lead key (at most one lives: ``lead``)."""
        return f"{self.prefix}/parts/{job_id}/{round_no}/lead/"

    def result(self, job_id: str, round_no: int) -> str:
        """The round's head: written last, once every assignment of the round is in place."""
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/result"

    def assignment(self, job_id: str, round_no: int, node: str) -> str:
        """``node``'s part in round ``round_no``: what it reads to start its workers (O(1) bytes)."""
        return f"{self.prefix}/rounds/{job_id}/{round_no}/{node}"

    def assignments(self, job_id: str, round_no: int) -> str:
        """Every assignment of round ``round_no``: what ``status`` of the job and the next round's
        leader read, in pages (``rosterread``)."""
        return f"{self.prefix}/rounds/{job_id}/{round_no}/"

    def done(self, job_id: str, round_no: int, node: str) -> str:
        """``node``'s workers of round ``round_no`` all exited 0: beside its join, outside every
        watch and the read of every job (each member's, once, when the job ends)."""
        return f"{self.prefix}/parts/{job_id}/{round_no}/done/{node}"

    def round_parts(self, job_id: str, round_no: int) -> str:
        """Round ``round_no``'s joins, done markers and lead key (``done/`` < ``join/`` < ``lead/``)."""
        return f"{self.prefix}/parts/{job_id}/{round_no}/"

    def left(self, job_id: str, round_no: int, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/left/{node}"

    def rounds(self, job_id: str, round_no: int) -> tuple[str, str, str]:
        """Every key of round ``round_no``: its joins, its records under the job (the head among
        them), then its assignments: deleted in this order, no read ever finds a head whose
        assignments are gone."""
        return (
            f"{self.prefix}/parts/{job_id}/{round_no}/",
            f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/",
            self.assignments(job_id, round_no),
        )

    def waiting(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/waiting/{node}"

    def node_status(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/reports/{job_id}/{node}"

    def pending_note(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/notes/{job_id}/{node}"

    def drains(self) -> str:
        return f"{self.prefix}/drain/"

    def drain(self, node: str) -> str:
        return f"{self.prefix}/drain/{node}"

    def check_request(self, node: str) -> str:
        """An operator's ``check`` asks ``node`` to serve a check (``manager/checks.py``)."""
        return f"{self.prefix}/checks/{node}"

    def check_answer(self, node: str) -> str:
        """``node``'s answer to the check it was asked for: its server's port and compute."""
        return f"{self.check_answers()}{node}"

    def check_answers(self) -> str:
        """Every node's answer: the asking daemon reads them in one request."""
        return f"{self.prefix}/checked/"

    def gpus(self, node: str) -> str:
        return f"{self.prefix}/gpus/{node}/"

    def gpu(self, node: str, uuid: str) -> str:
        return f"{self.prefix}/gpus/{node}/{uuid}"

    def job_drain(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/drain/{node}"

    # The event history's keys (``elasticd.etcd.eventkeys``).
    def events(self) -> str:
        return eventkeys.events(self.prefix)

    def event_ring(self, ring: EventRing, job_id: str | None = None) -> str:
        return eventkeys.event_ring(self.prefix, ring, job_id)

    def event(self, ring: EventRing, seq: int, job_id: str | None = None) -> str:
        return eventkeys.event(self.prefix, ring, seq, job_id)

    def event_seq(self) -> str:
        return eventkeys.event_counter(self.prefix)

    # -- parse ---------------------------------------------------------------------------------
    def relative(self, key: str) -> str:
        """``key`` without the prefix, as keys are named in messages (``jobs/<job>/spec``)."""
        return key.removeprefix(self.prefix + "/")

    def parse(self, key: str) -> KeyRef:
        """What ``key`` names; DecodeError if it is not a key of this layout."""
        if not key.startswith(self.prefix + "/"):
            raise DecodeError("", "the key is outside the prefix")
        match self.relative(key).split("/"):
            case [kind, node] if kind in _NODE_KEYS:
                return KeyRef(_NODE_KEYS[kind], node=_node(node))
            case ["gpus", node, uuid] if valid_gpu_uuid(uuid):
                return KeyRef(KeyKind.GPU, node=_node(node))
            case ["janitor"]:
                return KeyRef(KeyKind.JANITOR)
            case ["events", *_]:
                eventkeys.parse_event(self.relative(key))
                return KeyRef(KeyKind.EVENT)  # no job: an event wakes no one (``JobManager.wake``)
            case ["event_seq"]:
                return KeyRef(KeyKind.EVENT_SEQ)
            case ["jobs", job, *rest]:
                return _job_key(_job(job), rest)
            case [("parts" | "rounds" | "reports" | "notes") as tree, job, *rest]:
                return _part_key(tree, _job(job), rest)
            case ["presence", job, node]:
                return KeyRef(KeyKind.PRESENCE, _job(job), node=_node(node))
            case ["specs", job]:
                return KeyRef(KeyKind.BODY, _job(job))
            case _:
                raise DecodeError("", "no such key: the layout has no key of this name")

    def job_of(self, key: str) -> str | None:
        """The job a key is under (``jobs/<job>/...``, ``notes/<job>/...``, ``parts/<job>/...``,
        ``reports/<job>/...`` or ``rounds/<job>/...``), parsed or not; None for other keys."""
        for base in (self.jobs(), self.all_notes(), self.all_parts(), self.all_reports(), self.all_rounds()):
            if key.startswith(base):
                job, sep, _ = key[len(base) :].partition("/")
                return job if sep else None
        return None

    # -- route ---------------------------------------------------------------------------------
    def route(self, key: str, deleted: bool) -> Change | None:
        """A watch event as a ``Change``; None for a key outside the layout that names no job."""
        job = self.job_of(key)
        try:
            ref = self.parse(key)
        except DecodeError:
            return Change(job, None, deleted) if job is not None else None
        return Change(ref.job or None, ref, deleted)


def _job_key(job: str, rest: list[str]) -> KeyRef:
    match rest:
        case [leaf] if leaf in _JOB_LEAVES:
            return KeyRef(_JOB_LEAVES[leaf], job)
        case [kind, node] if kind in _JOB_NODE_KEYS:
            return KeyRef(_JOB_NODE_KEYS[kind], job, node=_node(node))
        case ["rdzv", r, "result"]:
            return KeyRef(KeyKind.RESULT, job, round_no(r))
        case ["rdzv", r, kind, node] if kind in _ROUND_NODE_KEYS:
            return KeyRef(_ROUND_NODE_KEYS[kind], job, round_no(r), _node(node))
        case _:
            raise DecodeError("", "no such key: a job has no record of this name")


def _part_key(tree: str, job: str, rest: list[str]) -> KeyRef:
    """A key under ``parts/<job>/`` (a join, its round a plain decimal), ``notes/<job>/`` (a
    node's pending note), ``reports/<job>/`` (a node's status) or ``rounds/<job>/`` (a member's
    assignment of a round)."""
    if tree in _NODE_TREES:
        if len(rest) != 1:
            raise DecodeError("", f"no such key: a job's {tree} have no record of this name")
        return KeyRef(_NODE_TREES[tree], job, node=_node(rest[0]))
    if tree == "rounds":
        if len(rest) != 2:
            raise DecodeError("", "no such key: a round has no record of this name")
        return KeyRef(KeyKind.ASSIGNMENT, job, round_no(rest[0]), _node(rest[1]))
    match rest:
        case [r, kind, node] if kind in _PART_KINDS:
            return KeyRef(_PART_KINDS[kind], job, round_no(r), _node(node))
        case _:
            raise DecodeError("", "no such key: a job's parts have no record of this name")


def round_no(text: str) -> int:
    """A round in a key: a plain non-negative decimal, as ``Keys`` writes it."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0") or len(text) > 10:
        raise DecodeError("", f"{text[:20]!r} in the key is not a round number")
    number = int(text)
    if number > MAX_ROUND:
        raise DecodeError("", f"round {number} in the key is out of range")
    return number


def _node(text: str) -> str:
    if not valid_node_id(text):
        raise DecodeError("", f"{text[:80]!r} in the key is not a node id")
    return text


def _job(text: str) -> str:
    if not valid_job_id(text):
        raise DecodeError("", "the job id in the key is not a valid job id")
    return text
