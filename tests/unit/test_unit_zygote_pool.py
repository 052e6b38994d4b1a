"""The node's pool of parked zygotes (``warm.pool``), against fake zygotes, and the real program's
freshness check (``zygote_program.boot``): adopt only the same key and only fresh; drop the dead, the
stale, the expired; close stops all; each move into a cgroup writes the zygote's own pid."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from elasticd.workers.cgroups.tracking import NoJobTracking
from elasticd.workers.warm import zygote as zy
from elasticd.workers.warm.pool import ZygotePool
from elasticd.workers.warm.pool_decider import Limits
from elasticd.workers.warm.spawn import ZygoteSetup
from elasticd.workers.zygote_program import boot, stamps
from tests.fakes import FAKE_ZYGOTE_HEAD, READY, NoReaper, until

pytestmark = pytest.mark.timeout(60)

# A parked zygote: answers checks (stale while $STALE_IF exists) and nothing else.
SERVE_CHECKS = READY + (
    "while True:\n"
    "    r = request()\n"
    "    if r.get('op') == 'check':\n"
    "        path = os.environ['STALE_IF']\n"
    "        stale = os.path.exists(path)\n"
    "        send(ev='checked', id=r['id'], fresh=not stale, files=3, changed=path * stale)\n"
)


DEFAULT = Limits(size=2, keep_s=60.0)


def setup(tmp_path: Path, job: str = "job-1", uid: int = 1000, **env: str) -> ZygoteSetup:
    base = {"PATH": os.environ["PATH"], "STALE_IF": str(tmp_path / "stale")}
    return ZygoteSetup(job, sys.executable, "script", "/s.py", str(tmp_path), base | env, None, uid=uid)


class PipeTracking:
    """Tracking whose ``cgroup.procs`` are pipes: what the pool writes there can be read back."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.base = None

    def written(self) -> bytes:
        os.set_blocking(self.r, False)
        try:
            return os.read(self.r, 100)
        except BlockingIOError:
            return b""

    def pool_procs(self) -> int:
        return os.dup(self.w)

    def join_zygote(self) -> int:
        return os.dup(self.w)

    def drop_pool(self) -> None:
        return None


def run(
    test: Callable[[ZygotePool, Callable[[ZygoteSetup], Awaitable[zy.Zygote]]], Awaitable[None]],
    limits: Limits = DEFAULT,
    tracker: object = None,
) -> None:
    async def main() -> None:
        pool = ZygotePool(limits, tracker)  # type: ignore[arg-type]
        started: list[zy.Zygote] = []

        async def ready_zygote(s: ZygoteSetup) -> zy.Zygote:
            z = zy.Zygote(s, NoReaper(), source=(FAKE_ZYGOTE_HEAD + SERVE_CHECKS).encode())  # type: ignore[arg-type]
            started.append(z)
            z.spawn()
            assert await z.ready()
            return z

        try:
            async with asyncio.timeout(30):
                await test(pool, ready_zygote)
        finally:
            await pool.close()
            for z in started:
                await z.close()

    asyncio.run(main())


def test_an_identical_job_adopts_the_parked_zygote(tmp_path: Path) -> None:
    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path, "job-1"))
        assert pool.offer(z) and len(pool) == 1
        got = await pool.take(setup(tmp_path, "job-2"), NoJobTracking())
        assert got is z and z.job == "job-2" and z.usable and len(pool) == 0
        assert await pool.take(setup(tmp_path, "job-3"), NoJobTracking()) is None  # taken once

    run(test)


def test_any_difference_in_user_env_or_cwd_adopts_nothing(tmp_path: Path) -> None:
    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        assert pool.offer(z)
        other_cwd = ZygoteSetup(
            "job-2", sys.executable, "script", "/s.py", "/", setup(tmp_path).env, None, uid=1000
        )
        for other in (setup(tmp_path, "job-2", uid=1001), setup(tmp_path, "job-2", X="1"), other_cwd):
            assert await pool.take(other, NoJobTracking()) is None
        assert len(pool) == 1 and z.usable

    run(test)


def test_a_stale_zygote_is_stopped_and_not_adopted(tmp_path: Path) -> None:
    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        assert pool.offer(z)
        (tmp_path / "stale").touch()
        assert await pool.take(setup(tmp_path, "job-2"), NoJobTracking()) is None
        await until(lambda: z.state is zy.ZygoteState.CLOSED)
        assert len(pool) == 0

    run(test)


def test_a_parked_zygote_that_dies_is_dropped(tmp_path: Path) -> None:
    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        assert pool.offer(z) and z.pid is not None
        os.kill(z.pid, signal.SIGKILL)
        await until(lambda: len(pool) == 0)  # its pidfd said so
        assert z.state is zy.ZygoteState.LOST
        assert await pool.take(setup(tmp_path, "job-2"), NoJobTracking()) is None

    run(test)


def test_a_parked_zygote_expires(tmp_path: Path) -> None:
    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        t0 = time.monotonic()
        assert pool.offer(z)
        await until(lambda: z.state is zy.ZygoteState.CLOSED)  # the pool's timer stopped it
        assert time.monotonic() - t0 >= 0.3 and len(pool) == 0

    run(test, Limits(size=2, keep_s=0.3))


def test_one_per_user_and_close_stops_all(tmp_path: Path) -> None:
    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        first, second = await ready(setup(tmp_path, X="1")), await ready(setup(tmp_path, X="2"))
        other = await ready(setup(tmp_path, uid=1001))
        assert pool.offer(first) and pool.offer(second) and pool.offer(other)
        await until(lambda: first.state is zy.ZygoteState.CLOSED)  # the same user's newer one replaced it
        assert len(pool) == 2
        await pool.close()
        assert second.state is other.state is zy.ZygoteState.CLOSED and len(pool) == 0
        late = await ready(setup(tmp_path, X="3"))
        assert not pool.offer(late)  # the caller stops it

    run(test)


def test_disabled_or_busy_zygotes_are_not_parked(tmp_path: Path) -> None:
    async def off(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        assert not pool.offer(await ready(setup(tmp_path)))
        assert await pool.take(setup(tmp_path), NoJobTracking()) is None

    run(off, Limits(size=0))

    async def busy(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        z._nonsense("a lie")  # one bogus message: it is not trusted for another job
        assert not pool.offer(z) and len(pool) == 0

    run(busy)


def test_moves_write_the_zygotes_own_pid(tmp_path: Path) -> None:
    tracking = PipeTracking()

    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        assert pool.offer(z)
        assert tracking.written() == str(z.pid).encode()  # into the pool's leaf
        assert await pool.take(setup(tmp_path, "job-2"), tracking) is z  # type: ignore[arg-type]
        assert tracking.written() == str(z.pid).encode()  # into the adopting job's

    try:
        run(test, tracker=tracking)
    finally:
        os.close(tracking.r)
        os.close(tracking.w)


def test_a_zygote_that_does_not_answer_its_check_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zy, "CHECK_TIMEOUT_S", 0.3)

    async def test(pool: ZygotePool, ready: Callable[[ZygoteSetup], Awaitable[zy.Zygote]]) -> None:
        z = await ready(setup(tmp_path))
        assert pool.offer(z) and z.pid is not None
        os.kill(z.pid, signal.SIGSTOP)
        try:
            assert await pool.take(setup(tmp_path, "job-2"), NoJobTracking()) is None
        finally:
            os.kill(z.pid, signal.SIGCONT)
        assert z.state is zy.ZygoteState.LOST and len(pool) == 0

    run(test)


# --- the real program's record of its modules' files ------------------------------------------------


def test_stamps_see_an_edit_a_replacement_and_a_removal(tmp_path: Path) -> None:
    files = [tmp_path / name for name in ("a.py", "b.py", "c.py")]
    for f in files:
        f.write_text("x = 1\n")
    since = time.time_ns() + 10**9  # the imports began after the files were written
    recorded = stamps.stamps([str(f) for f in files] + [str(tmp_path / "missing.py")], since)
    assert sorted(recorded) == sorted(str(f) for f in files) and stamps.changed(recorded) is None
    os.utime(files[1], ns=(time.time_ns(), time.time_ns() + 10**9))  # edited (same size)
    assert stamps.changed(recorded) == str(files[1])
    recorded = stamps.stamps([str(f) for f in files], time.time_ns() + 10**10)
    (tmp_path / "new").write_text("x = 1\n")
    (tmp_path / "new").replace(files[0])  # replaced (an upgrade's rename)
    assert stamps.changed(recorded) == str(files[0])
    recorded = stamps.stamps([str(files[2])], time.time_ns() + 10**10)
    files[2].unlink()
    assert stamps.changed(recorded) == str(files[2])


def test_a_file_written_after_the_imports_began_is_never_fresh(tmp_path: Path) -> None:
    f = tmp_path / "model.py"
    since = time.time_ns() - 10**9
    f.write_text("x = 1\n")  # could have changed after it was imported
    assert stamps.changed(stamps.stamps([str(f)], since)) == str(f)


def test_module_files_name_the_interpreter_and_loaded_modules() -> None:
    files = stamps.module_files()
    assert sys.executable in files and os.path.abspath(boot.__file__) in files
    assert all(os.path.isabs(f) for f in files)


def test_a_check_request_is_parsed() -> None:
    assert boot.parse_op(b'{"op": "check", "id": 3}', 0) == {"op": "check", "id": 3}
    assert boot.parse_op(b'{"op": "fork", "id": 1, "argv": [], "env": {}, "cwd": "/", "fds": ["log", "go"], '
                         b'"progress_fd": null}', 2)["op"] == "fork"  # fmt: skip
    for bad, nfds in (
        (b'{"op": "check", "id": -1}', 0),
        (b'{"op": "check", "id": 1}', 1),
        (b'{"op": "x"}', 0),
    ):
        with pytest.raises(boot.BadRequest):
            boot.parse_op(bad, nfds)
