"""The zygote: its program's pure parts, and the daemon's side against fake zygotes that lie.

Fake zygotes are small programs run by the real loader in place of ``zygote_program.boot``: they speak
the protocol, but report pids that are not theirs, exits of children that still run, garbage."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from elasticd.workers.group import Launch
from elasticd.workers.warm import messages as wire
from elasticd.workers.warm import spawn as zygote_spawn
from elasticd.workers.warm import zygote as zy
from elasticd.workers.zygote_program import boot, child, shared
from tests.fakes import FAKE_ZYGOTE_HEAD, READY, NoReaper, until

pytestmark = pytest.mark.timeout(60)


# --- the program's pure parts ---------------------------------------------------------------------


def request(**fields: Any) -> bytes:
    base = {"op": "fork", "id": 1, "argv": ["/py", "-u", "/s.py", "a"], "env": {"A": "1"}, "cwd": "/tmp",
            "fds": ["log", "go", "progress"], "progress_fd": 7}  # fmt: skip
    return json.dumps(base | fields).encode()


def test_a_good_request_is_parsed() -> None:
    req = boot.parse_request(request(), 3)
    assert req["argv"] == ["/py", "-u", "/s.py", "a"] and req["progress_fd"] == 7
    assert req["fds"] == ["log", "go", "progress"]


@pytest.mark.parametrize(
    ("data", "nfds"),
    [
        (b"not json", 1),
        (b"[1]", 1),
        (request(op="exec"), 3),
        (request(id=-1), 3),
        (request(id="1"), 3),
        (request(argv=["a", 1]), 3),
        (request(env={"A": 1}), 3),
        (request(env={"A=B": "1"}), 3),
        (request(env={"A": "x\0y"}), 3),
        (request(cwd="relative"), 3),
        (request(), 2),  # fewer fds attached than named
        (request(fds=["log", "log", "go"]), 3),
        (request(fds=["log", "go", "procs"]), 3),  # a cgroup.procs fd is never handed over
        (request(fds=["go", "progress"], progress_fd=7), 2),  # no log
        (request(fds=["log", "progress"], progress_fd=7), 2),  # no go
        (request(fds=["log", "go"], progress_fd=7), 2),  # a target without a progress fd
        (request(progress_fd=2), 3),  # would replace stderr
        (request(progress_fd="7"), 3),
    ],
)
def test_a_bad_request_is_refused(data: bytes, nfds: int) -> None:
    with pytest.raises(boot.BadRequest):
        boot.parse_request(data, nfds)


def test_config_names_modules_only() -> None:
    good = {"kind": "module", "entry": "pkg.train", "preload": ["numpy", "a.b"], "torch": True}
    assert boot.parse_config(json.dumps(good).encode())["preload"] == ["numpy", "a.b"]
    bads = [{"kind": "exec", "entry": "x"}, {"kind": "module", "entry": "../x"},
            {"kind": "script", "entry": "/s.py", "preload": ["os; rm"]},
            {"kind": "script", "entry": ""}]  # fmt: skip
    for bad in bads:
        with pytest.raises(boot.BadRequest):
            boot.parse_config(json.dumps(bad).encode())


def test_the_program_is_its_parts_and_fits_the_pipe() -> None:
    source = zygote_spawn.ZYGOTE.source()
    parts = source.split(b"\0")
    assert len(parts) == len(zygote_spawn.BOOT_PARTS) and len(source) < 65536
    assert all(compile(p, shared.BOOT_FILE, "exec") for p in parts)


def test_argv_and_path_are_the_interpreters() -> None:
    argv = ["/py", "-u", "/w/s.py", "--lr", "-m"]
    assert child.script_argv("script", "/w/s.py", argv) == ["/w/s.py", "--lr", "-m"]
    assert child.script_argv("module", "pkg.m", ["/py", "-u", "-m", "pkg.m", "x"]) == ["-m", "x"]
    assert child.path0("module", "pkg.m", "/cwd") == "/cwd"
    assert child.path0("script", "/etc/../etc/hosts", "/cwd") == "/etc"


# --- messages from the zygote ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"nonsense", b"[]", b'{"ev": "forked", "id": 1, "pid": 1}',
     b'{"ev": "forked", "id": 1, "pid": "2"}',
     b'{"ev": "exit", "pid": 5, "status": 70000}', b'{"ev": "exit", "pid": 5, "status": true}',
     b'{"ev": "ready", "pid": 5, "import_s": "x"}', b'{"ev": "hello"}', b'{"ev": "unavailable", "reason": 3}',
     b"{" + b" " * 5000 + b"}"],
)  # fmt: skip
def test_garbage_from_the_zygote_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.parse_message(data)


def test_messages_from_the_zygote_are_typed() -> None:
    assert wire.parse_message(b'{"ev": "exit", "pid": 5, "status": 256}') == wire.Exited(5, 256)
    assert wire.parse_message(b'{"ev": "forked", "id": 0, "pid": 9}') == wire.Forked(0, 9)
    assert wire.parse_message(b'{"ev": "unavailable", "reason": "' + b"x" * 900 + b'"}') == wire.Unavailable(
        "x" * 500
    )


# --- the daemon's side, against fake zygotes -------------------------------------------------------


def launch(tmp_path: Path) -> Launch:
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return Launch(0, 0, (sys.executable, "-u", "/s.py"), {"A": "1"}, str(tmp_path), fd, tmp_path / "log",
                  tmp_path / "error.json")  # fmt: skip


def with_zygote(tmp_path: Path, body: str, test: Callable[[zy.Zygote], Awaitable[None]]) -> None:
    setup = zygote_spawn.ZygoteSetup(
        "job-1", sys.executable, "script", "/s.py", str(tmp_path), dict(os.environ), None
    )

    async def run() -> None:
        z = zy.Zygote(setup, NoReaper(), source=(FAKE_ZYGOTE_HEAD + body).encode())  # type: ignore[arg-type]
        z.spawn()
        try:
            async with asyncio.timeout(30):
                await test(z)
        finally:
            await z.close()

    asyncio.run(run())


def test_a_pid_that_is_not_the_zygotes_child_is_never_adopted(tmp_path: Path) -> None:
    body = READY + "r = request()\nsend(ev='forked', id=r['id'], pid=os.getppid())\ntime.sleep(60)\n"

    async def test(z: zy.Zygote) -> None:
        assert await z.ready()
        with pytest.raises(zygote_spawn.ZygoteError):
            await z.fork(launch(tmp_path), None)
        assert z.state is zy.ZygoteState.LOST and "not its child" in z.reason
        await until(lambda: _zombie(z.pid))  # killed: it cannot be trusted

    with_zygote(tmp_path, body, test)


def _zombie(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_exit_reported_while_the_child_runs_is_ignored(tmp_path: Path) -> None:
    body = (
        READY + "r = request()\npid = child()\n"
        "send(ev='forked', id=r['id'], pid=pid)\n"
        "send(ev='exit', pid=pid, status=0)\n"  # a lie: it runs
        "send(ev='exit', pid=424242, status=0)\n"  # never asked for
        "_, status = os.waitpid(pid, 0)\nsend(ev='exit', pid=pid, status=status)\ntime.sleep(60)\n"
    )

    async def test(z: zy.Zygote) -> None:
        assert await z.ready()
        pid, exited = await z.fork(launch(tmp_path), None)
        await until(lambda: z._bogus >= 2)
        assert not exited.done(), "a report of an exit while the worker runs was believed"
        os.kill(pid, signal.SIGKILL)
        assert await exited == -signal.SIGKILL
        assert z.usable

    with_zygote(tmp_path, body, test)


def test_an_exit_reported_before_the_fork_is_adopted_is_kept_for_it(tmp_path: Path) -> None:
    """A child with no go to wait for (the store host) can end, and be reported, before the
    daemon acts on its fork's answer: its status is believed once its pid is adopted and found
    reaped, instead of waiting EXIT_REPORT_S for a report that came already."""
    body = (
        READY + "r = request()\npid = fork()\nif pid == 0:\n    os._exit(3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "send(ev='forked', id=r['id'], pid=pid)\nsend(ev='exit', pid=pid, status=status)\ntime.sleep(60)\n"
    )

    async def test(z: zy.Zygote) -> None:
        assert await z.ready()
        _, exited = await z.fork(launch(tmp_path), None)
        async with asyncio.timeout(5):
            assert await exited == 3
        assert z.usable and z._bogus == 0

    with_zygote(tmp_path, body, test)


def test_a_zygote_that_talks_nonsense_is_given_up(tmp_path: Path) -> None:
    body = READY + "for i in range(200):\n    ctl.send(b'garbage')\ntime.sleep(60)\n"

    async def test(z: zy.Zygote) -> None:
        await until(lambda: z.state is zy.ZygoteState.LOST)
        assert "bogus" in z.reason
        with pytest.raises(zygote_spawn.ZygoteError):
            await z.fork(launch(tmp_path), None)

    with_zygote(tmp_path, body, test)


def test_a_dead_zygotes_workers_are_killed_and_count_as_killed(tmp_path: Path) -> None:
    body = READY + "r = request()\nsend(ev='forked', id=r['id'], pid=child())\ntime.sleep(60)\n"

    async def test(z: zy.Zygote) -> None:
        assert await z.ready() and z.pid is not None
        pid, exited = await z.fork(launch(tmp_path), None)
        os.kill(z.pid, signal.SIGKILL)
        assert await exited == -signal.SIGKILL
        assert z.state is zy.ZygoteState.LOST
        await until(lambda: _zombie(pid))

    with_zygote(tmp_path, body, test)


def test_a_fake_zygotes_child_dies_with_it(tmp_path: Path) -> None:
    """The fakes' contract (``tests.fakes``): closing a zygote kills the zygote alone, so a child a
    test has not stopped (it failed, or timed out, first) must end with its fake, not outlive it."""
    body = READY + "r = request()\nsend(ev='forked', id=r['id'], pid=child())\ntime.sleep(60)\n"
    pidfds: list[int] = []

    async def test(z: zy.Zygote) -> None:
        assert await z.ready()
        pid, _ = await z.fork(launch(tmp_path), None)
        pidfds.append(os.pidfd_open(pid))
        await z.close()
        async with asyncio.timeout(10):
            await until(lambda: zygote_spawn.ended(pidfds[0]))

    try:
        with_zygote(tmp_path, body, test)
    finally:
        for pidfd in pidfds:
            if not zygote_spawn.ended(pidfd):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)


def test_a_zygote_that_says_it_is_unavailable_or_says_nothing_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unavailable(z: zy.Zygote) -> None:
        assert not await z.ready()
        assert z.state is zy.ZygoteState.UNAVAILABLE and z.reason == "no torch here"

    with_zygote(tmp_path, "send(ev='unavailable', reason='no torch here')\ntime.sleep(60)\n", unavailable)
    monkeypatch.setattr(zy, "READY_TIMEOUT_S", 0.5)

    async def silent(z: zy.Zygote) -> None:
        assert not await z.ready()
        assert "not ready within" in z.reason

    with_zygote(tmp_path, "time.sleep(60)\n", silent)


def test_the_real_program_refuses_to_serve_with_a_second_thread(tmp_path: Path) -> None:
    (tmp_path / "threadstarter.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    script = str(tmp_path / "s.py")
    setup = zygote_spawn.ZygoteSetup("job-1", sys.executable, "script", script, str(tmp_path), env, None,
                           preload=("threadstarter",), torch=False)  # fmt: skip

    async def run() -> None:
        z = zy.Zygote(setup, NoReaper())  # type: ignore[arg-type]
        z.spawn()
        try:
            assert not await z.ready()
            assert "2 threads" in z.reason
        finally:
            await z.close()

    asyncio.run(run())
