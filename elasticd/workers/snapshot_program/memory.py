"""Memory snapshots for ``elasticd.worker``: save into the job's keeper, persist behind, restore
the newest step every rank holds (torch imported lazily; nothing here runs under plain torchrun).

Persisting reads the frame back from a segment, never from the training loop's tensors, so the
loop may go on changing them: the file is the snapshot's step, whole. A segment is written again
two snapshots later (the keeper's double buffer), so a persist still running then is waited for
(``_Persist.before_snapshot``): the only way persisting can stall the loop is a disk slower than
two steps. The keeper writes the file too when the workers fail (``filing``); a persist asks it
first (``claim``), so the file never goes back in steps and a step is not written twice.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from elasticd.workers.snapshot_program import collective, frame
from elasticd.workers.snapshot_program import restore as nearest
from elasticd.workers.snapshot_program.client import KeeperClient, SnapshotError
from elasticd.workers.snapshot_program.filing import WRITE_TIMEOUT_S
from elasticd.workers.snapshot_program.protocol import SOCKET_ENV
from elasticd.workers.snapshot_program.replies import SKIP, Held

PERSIST_EVERY_ENV = "ELASTICD_SNAPSHOT_PERSIST_EVERY"
DEFAULT_PERSIST_EVERY = 10


def on() -> bool:
    """Whether this worker runs under elasticd's memory snapshots (the job's keeper was started)."""
    return SOCKET_ENV in os.environ


def say(event: str, **fields: Any) -> None:
    """One line on the rank's stderr (its log): ``elasticd: snapshot.restored step=3 ...``; only
    under elasticd (plain torchrun's output stays as it was)."""
    if SOCKET_ENV not in os.environ:
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"elasticd: {event} {text}".rstrip(), file=sys.stderr, flush=True)


def write_file(state: Any, target: Path) -> None:
    """``torch.save`` to ``target`` atomically (``atomic_write``)."""
    import torch

    atomic_write(target, lambda f: torch.save(state, f))


def atomic_write(target: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Write ``target`` with ``fill`` atomically: a temporary file, fsync, rename, fsync of the
    directory."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def may_write(client: KeeperClient | None, name: str, step: int) -> bool:
    """Whether this worker writes ``step`` to the file: not when the keeper wrote it or a newer
    one, or is writing it; after the keeper's own older write when one runs (``filing.claim``)."""
    if client is None:
        return True
    try:
        verdict, fd = client.claim(name, step)
    except SnapshotError:
        return True
    if fd is not None:
        try:
            select.select([fd], [], [], WRITE_TIMEOUT_S)
        finally:
            os.close(fd)
    return verdict != SKIP


class WriterThread:
    """A write behind, by one thread at a time, reading a segment that snapshot ``started_at + 2``
    overwrites (the keeper's double buffer); its error is said on the training thread's next wait."""

    said: dict[str, str] = {}  # what ``snapshot.persist_failed`` says besides the error

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.started_at = -2  # the snapshot count when it started (-1: from a restored snapshot)
        self.error: BaseException | None = None

    def before_snapshot(self, count: int) -> None:
        """The segment it reads is the one snapshot ``count`` may overwrite: wait for it then."""
        if self.thread is not None and count >= self.started_at + 2:
            self.wait()

    def wait(self) -> bool:
        """Wait for the running write; False when it failed (said on stderr)."""
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.join()
        if self.error is None:
            return True
        error, self.error = self.error, None
        say("snapshot.persist_failed", **self.said, error=repr(error)[:300])
        return False


class _Persist(WriterThread):
    """One name's file, written behind from a segment by a thread."""

    def __init__(self, name: str = "", client: KeeperClient | None = None) -> None:
        super().__init__()
        self.name, self.client = name, client
        self.steps: set[int] = set()  # steps written, or being written, by this process

    def start(self, buf: Any, target: Path, count: int, release: Any = None) -> None:
        self.wait()

        def run() -> None:
            try:
                step, state = frame.read(buf, views=True)
                self.steps.add(step)
                if not may_write(self.client, self.name, step):
                    say("snapshot.persist_skipped", step=step, reason="the keeper wrote it")
                    return
                write_file(state, target)
                if self.client is not None:
                    with contextlib.suppress(SnapshotError):
                        self.client.written(self.name, step)
                say("snapshot.persisted", step=step, path=target)
            except BaseException as exc:  # reported by the next wait, on the training thread
                self.error = exc
                self.steps.clear()
            finally:
                if release is not None:
                    release()

        self.started_at = count
        self.thread = threading.Thread(target=run, name="elasticd-persist", daemon=False)
        self.thread.start()


class Snapshots:
    """This process's snapshots, by name (the checkpoint's path)."""

    def __init__(self) -> None:
        self._client: KeeperClient | None = None
        self._checked = False
        self._counts: dict[str, int] = {}  # snapshots taken by this process, by name
        self._base: dict[str, int] = {}  # the step numbering's start when the state has no "step"
        self._persists: dict[str, _Persist] = {}
        self._last: dict[str, tuple[Any, Path, int, int]] = {}  # the writer's newest snapshot, by name
        self.broken = ""  # why the keeper is not used any more (said once)
        self.failed = False  # an uncaught exception ends the process

    def client(self) -> KeeperClient | None:
        if not self._checked:
            self._checked = True
            path = os.environ.get(SOCKET_ENV, "")
            self._client = KeeperClient(path) if path.startswith("/") else None
        return None if self.broken else self._client

    def _persist(self, name: str) -> _Persist:
        if name not in self._persists:
            self._persists[name] = _Persist(name, self.client())
        return self._persists[name]

    def save(self, state: Any, path: Path, writer: int, every: int | None, stopping: bool) -> bool:
        """Snapshot ``state``; False when it could not be (the caller writes the file)."""
        client = self.client()
        if client is None:
            return False
        name, me = str(path.absolute()), collective.rank()
        count = self._counts.get(name, 0)
        step = _step_of(state, self._base.get(name, 0) + count)
        persist = self._persist(name)
        persist.before_snapshot(count)
        try:
            slot = client.save(state, name, me, step, file=me == writer)
        except SnapshotError as exc:
            self.broken = str(exc)
            say("snapshot.unavailable", rank=me, reason=exc, fallback="disk")
            persist.wait()
            return False
        self._counts[name] = count + 1
        every = every if every is not None else _env_int(PERSIST_EVERY_ENV, DEFAULT_PERSIST_EVERY)
        due = stopping or (every > 0 and (count + 1) % every == 0)
        buf = client.mapped(name, me, slot)
        if me == writer and buf is not None:
            self._last_of(name, (buf, path, step, count))
            if due:
                persist.start(buf, path, count)
                if stopping:  # a planned stop: the file is there before the worker leaves, or written now
                    return persist.wait()
        return True

    def _last_of(self, name: str, last: tuple[Any, Path, int, int]) -> None:
        if not self._last:
            atexit.register(self.at_exit)
            sys.excepthook = self._failing(sys.excepthook)
        self._last[name] = last

    def _failing(self, previous: Any) -> Any:
        def hook(kind: Any, value: Any, tb: Any) -> None:
            self.failed = True
            previous(kind, value, tb)

        return hook

    def at_exit(self) -> None:
        """A script that ends leaves its newest snapshot in the file too (the writer rank, at a
        normal exit: a killed worker's newest snapshot stays in memory, for the restart). One that
        fails (an uncaught exception) leaves it to the keeper, which writes it once the group has
        stopped (``filing``): writing it here would hold the group's stop, and so its restart."""
        if self.failed and self.client() is not None:
            say("snapshot.persist_left", reason="failed: the keeper writes the newest snapshot")
            return
        for name, (buf, path, step, count) in self._last.items():
            persist = self._persist(name)
            persist.wait()
            if step not in persist.steps:
                persist.start(buf, path, count)
                persist.wait()

    def restore(self, path: Path, dist: Any) -> Any:
        """The state of the newest step any of the job's keepers holds, or None (the caller reads
        the file). A collective when ``dist`` is given: every rank must call it. It also tells this
        node's keeper the job's key and its replication peer (``snapshot_program.restore``)."""
        if SOCKET_ENV not in os.environ:  # not under elasticd's snapshots: no collective (plain torchrun)
            return None
        client = self.client()
        name, me = str(path.absolute()), collective.rank()
        mine, held, why = nearest.report(client, name, me)
        reports = nearest.gather(mine, dist)
        key = nearest.choose_key(reports)
        if client is not None and mine["port"]:
            with contextlib.suppress(SnapshotError):  # then this node's snapshots are not replicated
                client.key(key)
                peer = nearest.ring_peer(reports, me)
                client.peer(*(peer if peer is not None else (None, 0)))
        found = nearest.sources(reports, held, me)
        if not found:
            say("snapshot.memory_skipped", rank=me, reason=why or "no snapshot of this checkpoint in memory")
            return None
        assert client is not None or all(s.held is None for s in found)
        state, errors = None, []
        for source in found:
            try:
                state = nearest.load(client or KeeperClient(""), name, key, source)
                break
            except SnapshotError as exc:
                errors.append(str(exc))
        else:  # every other rank restores this step from memory: so must we, or fail
            raise RuntimeError(f"cannot restore the snapshot of step {found[0].step}: {'; '.join(errors)}")
        where = "memory" if source.held is not None else "peer"
        say("snapshot.restored", source=where, rank=me, step=source.step, from_rank=source.rank)
        self._counts[name] = 0
        self._base[name] = source.step + 1  # a state without "step" numbers on from the restored one
        if me == 0 and client is not None and source.held is not None:
            self._persist_restored(client, name, source.held, path)
        if dist is not None:
            dist.barrier()  # nobody's next snapshot may overwrite a segment another rank still reads
        return state

    def _persist_restored(self, client: KeeperClient, name: str, held: Held, path: Path) -> None:
        """After a failure, the restored snapshot is written to disk behind (a node lost next keeps it)."""
        import mmap

        if held.step in self._persist(name).steps:  # this process wrote it already
            return
        with contextlib.suppress(SnapshotError):
            verdict, fd = client.claim(name, held.step)  # the thread asks again, and waits
            if fd is not None:
                os.close(fd)
            if verdict == SKIP:  # the keeper wrote it, the workers having failed
                say("snapshot.persist_skipped", step=held.step, reason="the keeper wrote it")
                return
        try:
            opened, fd = client.open(name, held)
        except SnapshotError:
            return
        try:
            buf = mmap.mmap(fd, opened.length, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._persist(name).start(buf, path, -1, release=lambda: _close(buf))

    def flush(self) -> None:
        """Wait for every persist running."""
        for persist in self._persists.values():
            persist.wait()


def _close(buf: Any) -> None:
    with contextlib.suppress(BufferError):
        buf.close()


def _step_of(state: Any, count: int) -> int:
    step = state.get("step") if isinstance(state, dict) else None
    return step if type(step) is int and step >= 0 else count


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else default


SNAPSHOTS = Snapshots()
save = SNAPSHOTS.save
restore = SNAPSHOTS.restore
flush = SNAPSHOTS.flush
