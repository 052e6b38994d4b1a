"""The snapshot keeper: holds a job's newest snapshots on this node, in memory, across its workers'
deaths and restarts (standard library only; run in the job's interpreter, as the submitter).

The daemon starts one per job and node when the job is admitted (``workers.warm.keeper``), beside
the zygote and like it (the submitter's identity, cwd and environment, the job's tracking cgroup,
a parent-death signal), hands it this program's source over a pipe (after ``protocol``'s, in one
namespace), and stops it when the job ends here. It never reads a user's file and the daemon
never reads its segments.

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
4. exit, freeing every segment, when the daemon closes its control socket (the job ended here).

Memory: a segment's pages are charged to the cgroup of the process that first touches them, the
worker that writes the frame (under its rank's limits); they stay inside the job's cgroup.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import zlib
from typing import Any

if __name__ != "__elasticd_keeper__":  # the daemon's tests and mypy; in the keeper, globals already
    from elasticd.workers.snapshot_program.protocol import (
        HEADER,
        MAX_MESSAGE,
        BadMessage,
        align,
        encode,
        parse_header,
        parse_request,
    )

MAX_CLIENTS = 512  # a node's ranks, and a few more
MAX_KEYS = 4096  # (name, rank) pairs held
GRAIN = 2 << 20  # segments grow in steps of 2 MiB: a state that grows a little reuses its segment
EMPTY, WRITING, COMPLETE = "empty", "writing", "complete"


class Slot:
    """One segment of a double buffer."""

    __slots__ = ("capacity", "fd", "gen", "length", "seq", "state", "step")

    def __init__(self) -> None:
        self.fd = -1
        self.capacity = 0
        self.gen = 0
        self.state = EMPTY
        self.step = 0
        self.length = 0
        self.seq = 0  # commit order: the newest complete slot has the larger


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


def pick(pair: list[Slot]) -> int:
    """The slot a new snapshot goes to: never the newest complete one."""
    done = [i for i in (0, 1) if pair[i].state == COMPLETE]
    if not done:
        return 0
    if len(done) == 1:
        return 1 - done[0]
    return 0 if pair[0].seq < pair[1].seq else 1


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
    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.slots: dict[tuple[str, int], list[Slot]] = {}
        self._gen = 0
        self._seq = 0

    def held(self) -> int:
        return sum(s.capacity for pair in self.slots.values() for s in pair)

    def handle(self, req: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """A reply and the fd to send with it (the caller closes it after sending, if it is new)."""
        key = (req["name"], req.get("rank", -1))
        if req["op"] == "list":
            held = [
                {"rank": rank, "slot": i, "gen": s.gen, "step": s.step, "length": s.length}
                for (name, rank), pair in sorted(self.slots.items())
                if name == req["name"]
                for i, s in enumerate(pair)
                if s.state == COMPLETE
            ]
            return {"ok": True, "held": held}, None
        if req["op"] == "begin":
            return self._begin(key, req["step"], req["size"])
        pair = self.slots.get(key)
        slot = pair[req["slot"]] if pair is not None else None
        if slot is None or slot.gen != req["gen"]:
            return {"ok": False, "error": "no such segment (replaced since)"}, None
        if req["op"] == "commit":
            if slot.state != WRITING:
                return {"ok": False, "error": f"segment is {slot.state}, not being written"}, None
            why = verify(slot)
            if why is not None:
                slot.state = EMPTY
                return {"ok": False, "error": f"incomplete snapshot: {why}"}, None
            self._seq += 1
            slot.state, slot.seq = COMPLETE, self._seq
            return {"ok": True, "step": slot.step, "held": self.held()}, None
        if slot.state != COMPLETE:
            return {"ok": False, "error": f"segment is {slot.state}"}, None
        ro = os.open(f"/proc/self/fd/{slot.fd}", os.O_RDONLY | os.O_CLOEXEC)
        return {"ok": True, "length": slot.length, "step": slot.step}, ro

    def _begin(self, key: tuple[str, int], step: int, size: int) -> tuple[dict[str, Any], int | None]:
        pair = self.slots.get(key)
        if pair is None:
            if len(self.slots) >= MAX_KEYS:
                return {"ok": False, "error": f"more than {MAX_KEYS} snapshot names and ranks"}, None
            pair = self.slots[key] = [Slot(), Slot()]
        index = pick(pair)
        slot = pair[index]
        why = over_bound(self.held(), slot, size, self.bound)
        if why is not None:
            return {"ok": False, "error": why}, None
        if size > slot.capacity:
            fd = segment(grown(size))
            if slot.fd >= 0:
                os.close(slot.fd)
            self._gen += 1
            slot.fd, slot.capacity, slot.gen = fd, grown(size), self._gen
        slot.state, slot.step, slot.length = WRITING, step, 0
        reply = {"ok": True, "slot": index, "gen": slot.gen, "capacity": slot.capacity}
        return reply, os.dup(slot.fd)


def _send(conn: socket.socket, reply: dict[str, Any], fd: int | None) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))] if fd is not None else []
    try:
        conn.sendmsg([encode(**reply)], anc)
    finally:
        if fd is not None:
            os.close(fd)


def _serve_one(keeper: Keeper, conn: socket.socket) -> bool:
    """One request from ``conn``; False when the connection is done."""
    try:
        data, _, flags, _ = conn.recvmsg(MAX_MESSAGE + 1)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    if not data:
        return False
    try:
        if flags & socket.MSG_TRUNC:
            raise BadMessage("message too long")
        reply, fd = keeper.handle(parse_request(data))
    except BadMessage as exc:
        reply, fd = {"ok": False, "error": str(exc)}, None
    except OSError as exc:  # a segment the kernel would not give (memory): this snapshot fails
        reply, fd = {"ok": False, "error": f"cannot make a segment: {exc.strerror or exc}"}, None
    try:
        _send(conn, reply, fd)
    except OSError:
        return False
    return True


def _accept(listener: socket.socket, clients: dict[int, socket.socket]) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid() or len(clients) >= MAX_CLIENTS:
        conn.close()
        return
    clients[conn.fileno()] = conn


def serve(ctl: socket.socket, listener: socket.socket, keeper: Keeper) -> None:
    """Until the daemon closes ``ctl``."""
    clients: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([ctl.fileno(), listener.fileno(), *clients], [], [])
        if ctl.fileno() in ready and not ctl.recv(1):
            return
        if listener.fileno() in ready:
            _accept(listener, clients)
        for fd in ready:
            conn = clients.get(fd)
            if conn is not None and not _serve_one(keeper, conn):
                del clients[fd]
                conn.close()


def main(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        bound = int(ctl.recv(256))
    except ValueError:
        ctl.send(encode(ev="unavailable", reason="bad configuration"))
        return
    where = tempfile.mkdtemp(prefix="elasticd-snapshots-")  # 0700, ours, a fresh name
    path = os.path.join(where, "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(path)
        listener.listen(64)
        ctl.send(encode(ev="ready", pid=os.getpid(), socket=path))
        serve(ctl, listener, Keeper(bound))
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(where)


if __name__ == "__elasticd_keeper__":
    main(globals()["CTL_FD"])  # given by the loader
