"""The snapshot keeper: holds a job's newest snapshots on this node, in memory, across its workers'
deaths and restarts (standard library only; run in the job's interpreter, as the submitter).

The daemon starts one per job and node when the job is admitted (``workers.warm.snapshotkeeper``), beside
the zygote and like it (the submitter's identity, cwd and environment, the job's tracking cgroup,
a parent-death signal), hands it this program's source over a pipe (after ``protocol``,
``replies`` and ``requests``, in one namespace), and stops it when the job ends here. It never reads a user's
file and the daemon never reads its segments.

What it does:
1. make a 0700 directory of its own (``tempfile.mkdtemp``, as the submitter) and listen there on
   ``sock``, accepting connections of its own uid only; tell the daemon the path (``ready``), which
   the daemon puts in each worker's environment (``protocol.SOCKET_ENV``);
2. keep two segments per (name, rank), a double buffer: a ``begin`` gets the one that is *not*
   the newest complete snapshot (memfd, or where that is refused an unlinked file of
   ``/dev/shm``), grown if needed within the job's byte bound; the worker copies its frame in and
   ``commit`` checks the frame's header and the meta's CRC before the slot counts as complete. A
   worker that dies mid-copy leaves that slot ``writing`` and the previous snapshot whole;
3. ``list`` the complete snapshots of a name, and ``open`` one: a read-only fd of its segment;
4. replicate each complete snapshot to one other node's keeper, once the ranks told it the job's
   key and its peer (``key``, ``peer``; ``peers``), and hold the replicas other keepers send it,
   double-buffered in the same way and within the same bound;
5. write the newest complete snapshot of each checkpoint file to the user's path when the daemon
   says the workers here stopped (a failure) and when the job ends here (``filing``);
6. exit, freeing every segment, when the daemon closes its control socket (the job ended here)
   and its writes are done.

Memory: a segment's pages are charged to the cgroup of the process that first touches them, the
worker that writes the frame (under its rank's limits); they stay inside the job's cgroup.
"""

from __future__ import annotations

import os
import threading
import zlib

if __name__ != "__elasticd_keeper__":  # the daemon's tests and mypy; in the keeper, globals already
    from elasticd.workers.snapshot_program.filing import (
        Due,
        Filed,
        claim,
        due,
        due_shards,
        file_key,
        slot_name,
    )
    from elasticd.workers.snapshot_program.protocol import HEADER, BadMessage, align, parse_header
    from elasticd.workers.snapshot_program.replies import (
        WAIT,
        Begun,
        Claimed,
        Committed,
        Done,
        Held,
        KeyKnown,
        Listed,
        Opened,
        Refused,
        Reply,
    )
    from elasticd.workers.snapshot_program.requests import (
        Begin,
        Claim,
        Commit,
        Key,
        ListHeld,
        Local,
        Open,
        Peer,
        Written,
    )

MAX_KEYS = 4096  # (name, rank) pairs held
MAX_SLOTS = 3  # two, and one more while a restored worker still shares a pinned one
GRAIN = 2 << 20  # segments grow in steps of 2 MiB: a state that grows a little reuses its segment
EMPTY, WRITING, COMPLETE = "empty", "writing", "complete"


class Slot:
    """One segment of a double buffer."""

    __slots__ = ("begun", "capacity", "fd", "gen", "length", "pinned", "seq", "state", "step")

    def __init__(self) -> None:
        self.fd = -1
        self.capacity = 0
        self.gen = 0
        self.state = EMPTY
        self.step = 0
        self.length = 0
        self.seq = 0  # commit order: the newest complete slot has the larger
        self.begun = 0  # writes begun in it: a reader that saw it change read a torn frame
        self.pinned = False  # a worker restored from it copy-on-write: never written again


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


def newest(pair: list[Slot]) -> int:
    """The newest complete slot's index (-1: none)."""
    done = [i for i, s in enumerate(pair) if s.state == COMPLETE]
    return max(done, key=lambda i: pair[i].seq) if done else -1


def pick(pair: list[Slot]) -> int:
    """The slot a new snapshot goes to: never the newest complete one, nor a pinned one (a
    worker's restored state may still share its pages); the oldest of the others. A third slot
    is added (``len(pair)`` returned) when a pin leaves no other."""
    top = newest(pair)
    free = [i for i, s in enumerate(pair) if i != top and not s.pinned]
    return min(free, key=lambda i: pair[i].seq) if free else len(pair)


def retired(pair: list[Slot]) -> list[int]:
    """Pinned slots two newer complete snapshots have replaced: their segments can be let go
    (closed, never reused: a worker's mapping keeps its pages as long as it needs them)."""
    seqs = sorted((s.seq for s in pair if s.state == COMPLETE), reverse=True)
    if len(seqs) < 3:
        return []
    return [i for i, s in enumerate(pair) if s.pinned and s.seq < seqs[1]]


def grown(size: int) -> int:
    return max(GRAIN, (size + GRAIN - 1) // GRAIN * GRAIN)


def over_bound(held: int, slot: Slot, size: int, bound: int) -> str | None:
    """Why a snapshot of ``size`` bytes into ``slot`` cannot be taken (None: it can)."""
    if size <= slot.capacity:
        return None
    after = held - slot.capacity + grown(size)
    if after > bound:
        return (
            f"a snapshot of {size} bytes would make the job's snapshots on this node hold {after} bytes,"
            f" over its bound of {bound} (setting snapshot_bytes; two are held per rank)"
        )
    return None


# --- segments ------------------------------------------------------------------------------------


def segment(size: int) -> int:
    """A new anonymous shared segment of ``size`` bytes: a memfd (nothing named to leak if we are
    killed, no ``/dev/shm`` size limit), else a ``/dev/shm`` file unlinked at once."""
    try:
        fd = os.memfd_create("elasticd-snapshot", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        path = f"/dev/shm/.elasticd-snapshot-{os.getpid()}-{os.urandom(8).hex()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def verify(slot: Slot) -> str | None:
    """Why the frame in ``slot`` is not a whole snapshot of its step (None: it is)."""
    try:
        step, meta_len, total, crc = parse_header(os.pread(slot.fd, HEADER.size, 0))
    except (BadMessage, OSError) as exc:
        return str(exc)
    if step != slot.step or total > slot.capacity:
        return f"header says step {step}, {total} bytes"
    meta = os.pread(slot.fd, meta_len, align(HEADER.size))
    if len(meta) != meta_len or zlib.crc32(meta) != crc:
        return "the meta's checksum does not match"
    slot.length = total
    return None


# --- the keeper ----------------------------------------------------------------------------------


class Keeper:
    """Every snapshot and replica this node holds for the job. ``lock`` guards all of it: the main
    loop, the replication server and the pusher (``peers``) each take it for their lookups, never
    for a copy."""

    def __init__(self, bound: int, address: str = "", port: int = 0) -> None:
        self.bound = bound
        self.address, self.port = address, port  # where ``peers.Server`` listens (none: port 0)
        self.slots: dict[tuple[str, int], list[Slot]] = {}
        self.replicas: dict[tuple[str, int], list[Slot]] = {}
        self.key: bytes | None = None
        self.peer: tuple[str, int] | None = None
        self.lock = threading.Lock()
        self.pushes: dict[tuple[str, int], int] = {}  # complete snapshots not yet replicated: key -> slot
        self.wake = threading.Condition(self.lock)
        self.filed: dict[str, Filed] = {}  # checkpoint files written from this keeper's snapshots
        self._gen = 0
        self._seq = 0

    def held(self) -> int:
        pairs = [*self.slots.values(), *self.replicas.values()]
        return sum(s.capacity for pair in pairs for s in pair)

    def handle(self, req: Local) -> tuple[Reply, int | None]:
        """A reply and the fd to send with it (the caller closes it after sending)."""
        with self.lock:
            return self._handle(req)

    def _handle(self, req: Local) -> tuple[Reply, int | None]:
        match req:
            case Key(key=given):
                if given is not None:
                    self.key = bytes.fromhex(given)
                known = self.key.hex() if self.key is not None else None
                return KeyKnown(known, self.address, self.port), None
            case Peer(address=address, port=port):
                self.peer = (address, port) if address is not None else None
                self.pushes = {
                    k: self.newest(pair) for k, pair in self.slots.items() if self.newest(pair) >= 0
                }
                self.wake.notify_all()
                return Done(), None
            case ListHeld(name=name):
                return Listed(self.listing(name)), None
            case Claim(name=name, step=step):
                return self._claim(name, step)
            case Written(name=name, step=step):
                filed = self.filed.get(name)
                if filed is not None:
                    filed.on_disk = max(filed.on_disk, step)
                return Done(), None
            case Begin():
                fkey = file_key(req.name, req.rank)
                if req.file and (fkey in self.filed or len(self.filed) < MAX_KEYS):
                    filed = self.filed.setdefault(fkey, Filed(req.rank))
                    filed.rank, filed.lib = req.rank, req.lib
                got = self._begin(self.slots, (req.name, req.rank), req.step, req.size)
                return (got, None) if isinstance(got, Refused) else got
            case Commit() | Open():
                return self._segment(req)

    def _segment(self, req: Commit | Open) -> tuple[Reply, int | None]:
        """A commit of the segment ``begin`` gave, or a read-only fd of a complete one (an open)."""
        key = (req.name, req.rank)
        pair = (self.replicas if isinstance(req, Open) and req.replica else self.slots).get(key)
        slot = pair[req.slot] if pair is not None and req.slot < len(pair) else None
        if slot is None or slot.gen != req.gen:
            return Refused("no such segment (replaced since)"), None
        if isinstance(req, Commit):
            return self._commit(key, req.slot, slot), None
        if slot.state != COMPLETE:
            return Refused(f"segment is {slot.state}"), None
        slot.pinned = slot.pinned or req.pin
        ro = os.open(f"/proc/self/fd/{slot.fd}", os.O_RDONLY | os.O_CLOEXEC)
        return Opened(slot.length, slot.step), ro

    def _claim(self, name: str, step: int) -> tuple[Claimed, int | None]:
        """Whether a worker writes ``step`` to the file now (``filing.claim``), with an fd to wait
        on while the keeper writes an older one."""
        filed = self.filed.get(name)
        verdict = claim(filed, step)
        waiter = os.dup(filed.waiter) if verdict == WAIT and filed is not None and filed.waiter >= 0 else None
        return Claimed(verdict), waiter

    def take_due(self) -> list[Due]:
        """The files to write now (``filing.due``); every file is clean after."""
        out = []
        with self.lock:
            for name, filed in self.filed.items():
                pair = self.slots.get((slot_name(name), filed.rank), [])
                top = newest(pair)
                if name != slot_name(name):  # a checkpoint directory's shards (``filing.due_shards``)
                    steps = due_shards(filed, [s.step for s in pair if s.state == COMPLETE])
                    chosen = [s for s in pair if s.state == COMPLETE and s.step in steps]
                else:
                    chosen = [pair[top]] if due(filed, pair[top].step if top >= 0 else None) else []
                for slot in chosen:
                    fd = os.open(f"/proc/self/fd/{slot.fd}", os.O_RDONLY | os.O_CLOEXEC)
                    slot.pinned, filed.running = True, max(filed.running, slot.step)
                    out.append(Due(name, fd, slot.length, slot.step, filed.lib))
                filed.dirty = False
        return out

    def writing(self, name: str, waiter: int) -> None:
        """The keeper's write of the file began: ``waiter`` reaches EOF when it ends."""
        with self.lock:
            self.filed[name].waiter = waiter

    def wrote(self, name: str, step: int, ok: bool) -> None:
        """The keeper's write of ``step`` to the file ended (or never began)."""
        with self.lock:
            filed = self.filed[name]
            filed.waiter = filed.running = -1
            if ok:
                filed.on_disk = max(filed.on_disk, step)

    def listing(self, name: str) -> tuple[Held, ...]:
        return tuple(
            Held(rank, i, s.gen, s.step, s.length, replica)
            for replica, table in ((False, self.slots), (True, self.replicas))
            for (held, rank), pair in sorted(table.items())
            if held == name
            for i, s in enumerate(pair)
            if s.state == COMPLETE
        )

    @staticmethod
    def newest(pair: list[Slot]) -> int:
        return newest(pair)

    @staticmethod
    def _retire(pair: list[Slot]) -> None:
        for i in retired(pair):
            os.close(pair[i].fd)
            pair[i] = Slot()

    def find(self, name: str, rank: int, step: int) -> Slot | None:
        """A complete snapshot or replica of ``(name, rank)`` at ``step``."""
        for table in (self.slots, self.replicas):
            for slot in table.get((name, rank), []):
                if slot.state == COMPLETE and slot.step == step:
                    return slot
        return None

    def _complete(self, slot: Slot) -> str | None:
        """The one commit, of a worker's snapshot and of a replica alike: the frame written into
        ``slot`` is checked and becomes the newest complete one of its pair; or why not (a torn
        frame leaves the slot empty)."""
        if slot.state != WRITING:
            return f"segment is {slot.state}, not being written"
        why = verify(slot)
        if why is not None:
            slot.state = EMPTY
            return f"incomplete snapshot: {why}"
        self._seq += 1
        slot.state, slot.seq = COMPLETE, self._seq
        return None

    def _commit(self, key: tuple[str, int], index: int, slot: Slot) -> Committed | Refused:
        why = self._complete(slot)
        if why is not None:
            return Refused(why)
        self._retire(self.slots[key])
        filed = self.filed.get(file_key(*key))
        if filed is not None and filed.rank == key[1]:
            filed.dirty = True
        if self.peer is not None and key in self.slots:
            self.pushes[key] = index
            self.wake.notify_all()
        return Committed(slot.step, self.held())

    def _begin(
        self, table: dict[tuple[str, int], list[Slot]], key: tuple[str, int], step: int, size: int
    ) -> tuple[Begun, int] | Refused:
        """A segment to write a snapshot of ``key`` into, and an fd of it; or why not."""
        pair = table.get(key)
        if pair is None:
            if len(self.slots) + len(self.replicas) >= MAX_KEYS:
                return Refused(f"more than {MAX_KEYS} snapshot names and ranks")
            pair = table[key] = [Slot(), Slot()]
        index = pick(pair)
        if index == len(pair):
            if index >= MAX_SLOTS:
                return Refused("every segment is pinned by a restored worker")
            pair.append(Slot())
        slot = pair[index]
        why = over_bound(self.held(), slot, size, self.bound)
        if why is not None:
            return Refused(why)
        if size > slot.capacity:
            fd = segment(grown(size))
            if slot.fd >= 0:
                os.close(slot.fd)
            self._gen += 1
            slot.fd, slot.capacity, slot.gen = fd, grown(size), self._gen
        slot.state, slot.step, slot.length = WRITING, step, 0
        slot.begun += 1
        return Begun(index, slot.gen, slot.capacity), os.dup(slot.fd)

    def begin_replica(self, name: str, rank: int, step: int, size: int) -> tuple[Slot, int, int] | str:
        """A replica's segment to receive into: ``(slot, gen, fd)``, or why not. Never an older
        step than the newest replica held (a replayed put is refused)."""
        with self.lock:
            pair = self.replicas.get((name, rank))
            if pair is not None and (newest := self.newest(pair)) >= 0 and pair[newest].step > step:
                return f"holds step {pair[newest].step} already"
            got = self._begin(self.replicas, (name, rank), step, size)
            if isinstance(got, Refused):
                return got.error
            begun, fd = got
            return self.replicas[(name, rank)][begun.slot], begun.gen, fd

    def commit_replica(self, slot: Slot, gen: int) -> str | None:
        with self.lock:
            if slot.gen != gen:
                return "replaced while it was received"
            return self._complete(slot)
