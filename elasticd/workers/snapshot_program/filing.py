"""The keeper's writes behind: the newest complete snapshot of a checkpoint file, written to the
user's path when the daemon says the job's workers here have stopped (standard library only; part
of the keeper's program, after ``protocol``, ``replies``, ``requests`` and ``replica``; see ``keeper``).

A worker writes its file itself every N snapshots, on a stop and at its exit (``memory``); a
worker that fails cannot, so without this a job that ends FAILED keeps only the last every-N
file. The daemon sends ``persist`` on the keeper's control socket once a group's processes are
all gone (a failure, a restart, a stop) and closes it when the job ends here; the keeper then
starts, for each file whose writing rank committed a snapshot since, a child of the job's own
interpreter (``persister``: torch's save, atomically, as the submitter; the daemon never opens
a snapshot) on a read-only fd of the pinned segment, under ``WRITE_TIMEOUT_S``, and tells the
daemon how it went (``persisting``, ``persisted``, ``persist_failed``). A
``torch.distributed.checkpoint`` directory's shards are filed per rank (``file_key``) and its
metadata as a file of the coordinator's: each held step newer than the directory is written
(``due_shards``), and the commit follows once every rank's shard is in (``dcpfiles``).

Order on disk: the file never goes back in steps. A worker asks before it writes (``claim``):
a step the keeper's write already covers is skipped; one newer waits for the keeper's write to
end (an fd that reaches EOF then) and lands after it. The daemon's ``persist`` comes before the
next group starts, so no claim of a new worker is served before the keeper's write is known.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

if __name__ != "__elasticd_keeper__":  # the daemon's tests and mypy; in the keeper, globals already
    from elasticd.workers.snapshot_program.protocol import Report, WriteReport
    from elasticd.workers.snapshot_program.replies import SKIP, WAIT, WRITE

WRITE_TIMEOUT_S = 120.0  # a child's import of torch and a write of the bound's bytes, with fsync
MAX_TAIL = 300  # of a failed child's stderr, in its report
CHILD = (  # the writing rank's elasticd first: the frame's pickles name its classes
    "import sys;sys.argv[1] and sys.path.insert(0,sys.argv[1]);"
    "from elasticd.workers.snapshot_program.persister import main;main(sys.argv[2:])"
)
DCP_SHARDS, DCP_META = "#dcp", "#dcp-meta"  # the names ``dcp``'s writer snapshots a checkpoint under


class Filed:
    """A checkpoint file a rank writes from this keeper's snapshots (its ``begin`` said ``file``)."""

    __slots__ = ("dirty", "lib", "on_disk", "rank", "running", "waiter")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.dirty = False  # the rank committed a snapshot since the last ``persist``
        self.on_disk = -1  # the newest step known written (by a worker or by the keeper)
        self.running = -1  # the step the keeper's child is writing (-1: none)
        self.waiter = -1  # the fd that reaches EOF when that child ends (claims wait on a dup)
        self.lib = ""  # the directory the rank imported elasticd from ("": the job's sys.path)


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


def due(filed: Filed, newest: int | None) -> bool:
    """Whether the keeper writes step ``newest`` (its newest complete snapshot of the file's rank)
    now: one the workers committed since the last ``persist`` (a rank that moved to another node
    leaves no stale step to write here), newer than the file and than a write running."""
    return filed.dirty and newest is not None and newest > max(filed.on_disk, filed.running)


def file_key(name: str, rank: int) -> str:
    """What a file is filed under: its name; for a ``torch.distributed.checkpoint`` directory's
    shards, which every rank writes under one name, the name and the rank."""
    return f"{name}@{rank}" if name.endswith(DCP_SHARDS) else name


def slot_name(key: str) -> str:
    """The snapshots' name a file key writes from."""
    name, at, _ = key.rpartition("@")
    return name if at and name.endswith(DCP_SHARDS) else key


def due_shards(filed: Filed, held: list[int]) -> list[int]:
    """The steps of a rank's shards to write now, of the complete ones its keeper ``held``: all
    newer than the directory, when it committed some since the last ``persist``. Both, not the
    newest only: the step the coordinator commits is the newest whose metadata it holds, and a
    rank may have snapshotted its shard of the next step already."""
    if not filed.dirty:
        return []
    return sorted(step for step in held if step > max(filed.on_disk, filed.running))


def claim(filed: Filed | None, step: int) -> str:
    """What a worker about to write ``step`` to the file does: ``write``, ``skip`` (the file has
    it, or the keeper is writing it or a newer one) or ``wait`` (for the keeper's older write)."""
    if filed is None:
        return WRITE
    if step <= max(filed.on_disk, filed.running):
        return SKIP
    return WAIT if filed.running >= 0 else WRITE


def outcome(code: int, over: bool, tail: bytes) -> tuple[bool, str]:
    """What a write's end says ``(ok, why)``: the child's exit ``code``, whether it ran ``over``
    ``WRITE_TIMEOUT_S`` (and was killed), the ``tail`` of its stderr (its last line is the why)."""
    if over:
        return False, f"timed out after {WRITE_TIMEOUT_S:.0f} s"
    if code == 0:
        return True, ""
    lines = tail.decode(errors="replace").strip().splitlines()
    return False, (lines[-1] if lines else f"exit status {code}")[-MAX_TAIL:]


# --- the children --------------------------------------------------------------------------------


class Child:
    """One running write: the child, what it writes, the fd its end is seen on."""

    __slots__ = ("done_r", "name", "proc", "started", "step", "tail")

    def __init__(self, proc: subprocess.Popen[bytes], name: str, step: int, done_r: int) -> None:
        self.proc = proc
        self.name, self.step = name, step
        self.started = time.monotonic()
        self.done_r = done_r  # EOF once the child is gone: what claims wait on (dup'ed to them)
        self.tail = b""


def spawn(fd: int, length: int, step: int, target: str, lib: str = "") -> Child:
    """A child writing the frame in ``fd`` (read-only, ``length`` bytes, of ``step``) to ``target``,
    with ``lib`` first on its path. Takes ``fd`` (closed here). Raises ``OSError``."""
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, lib, str(fd), str(length), str(step), target],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(fd, done_w),
        )
    except BaseException:
        os.close(done_r)
        raise
    finally:
        os.close(done_w)
        os.close(fd)
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    return Child(proc, target, step, done_r)


def drain(child: Child) -> bool:
    """Read what the child said on its stderr (non-blocking; the tail is kept); False once it
    closed it."""
    assert child.proc.stderr is not None
    for _ in range(64):  # a bounded turn: a chatty child cannot hold the keeper's loop
        try:
            data = os.read(child.proc.stderr.fileno(), 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        child.tail = (child.tail + data)[-MAX_TAIL:]
    return True


def reap(child: Child, now: float) -> tuple[bool, str] | None:
    """The child's outcome once it ended ``(ok, why)``, killed when over ``WRITE_TIMEOUT_S``
    (None: still running)."""
    over = now - child.started > WRITE_TIMEOUT_S
    if over:
        with contextlib.suppress(OSError):
            child.proc.kill()
    try:
        code = child.proc.wait(5.0 if over else 0.0)
    except subprocess.TimeoutExpired:
        return None
    with contextlib.suppress(OSError):
        os.close(child.done_r)
    if child.proc.stderr is not None:
        child.proc.stderr.close()
    return outcome(code, over, child.tail)


@dataclass(frozen=True)
class Due:
    """A file to write now: its snapshot's segment (``fd``, read-only, pinned: never written
    again), its length and step, and where the writing rank's ``elasticd`` is (``lib``)."""

    name: str
    fd: int
    length: int
    step: int
    lib: str


class Files(Protocol):
    """What ``Behind`` needs of the keeper (``keeper.Keeper``)."""

    def take_due(self) -> list[Due]: ...

    def writing(self, name: str, waiter: int) -> None: ...

    def wrote(self, name: str, step: int, ok: bool) -> None: ...


class Behind:
    """The keeper's running writes, driven by its loop (``main.serve``): ``start`` on the daemon's
    word, ``read``/``poll`` on every turn; ``tell`` reports to the daemon."""

    def __init__(self, keeper: Files, tell: Callable[[WriteReport], None]) -> None:
        self.keeper = keeper
        self.tell = tell
        self.children: dict[int, Child] = {}  # by the fd of the child's stderr
        self.quiet: set[int] = set()  # children whose stderr closed: their exit is waited for

    def start(self) -> None:
        for due in self.keeper.take_due():
            try:
                child = spawn(due.fd, due.length, due.step, due.name, due.lib)
            except OSError as exc:
                self.keeper.wrote(due.name, due.step, False)
                self.tell(
                    WriteReport(Report.PERSIST_FAILED, due.step, reason=f"cannot start: {exc}"[:MAX_TAIL])
                )
                continue
            assert child.proc.stderr is not None
            self.children[child.proc.stderr.fileno()] = child
            self.keeper.writing(due.name, child.done_r)
            self.tell(WriteReport(Report.PERSISTING, due.step, pid=child.proc.pid))

    def fds(self) -> list[int]:
        return [fd for fd in self.children if fd not in self.quiet]

    def timeout(self) -> float | None:
        """How long the loop may wait for the next turn: it looks at running children often."""
        return 0.05 if self.quiet else 0.5 if self.children else None

    def read(self, ready: list[int]) -> None:
        for fd in ready:
            child = self.children.get(fd)
            if child is not None and fd not in self.quiet and not drain(child):
                self.quiet.add(fd)

    def poll(self) -> None:
        now = time.monotonic()
        for fd, child in list(self.children.items()):
            if child.proc.poll() is None and now - child.started <= WRITE_TIMEOUT_S:
                continue
            if fd not in self.quiet:
                drain(child)
            outcome = reap(child, now)
            if outcome is None:
                continue
            del self.children[fd]
            self.quiet.discard(fd)
            ok, why = outcome
            self.keeper.wrote(child.name, child.step, ok)
            took = round(now - child.started, 3)
            if ok:
                self.tell(WriteReport(Report.PERSISTED, child.step, took_s=took))
            else:
                self.tell(WriteReport(Report.PERSIST_FAILED, child.step, took_s=took, reason=why))
