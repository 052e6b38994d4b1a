"""A group's stop reaches each worker itself, not only through its process group. A warm worker
is forked by its zygote and makes its own session a moment later (``setsid``); a stop in between
found no group of its pid, so its SIGTERM was lost and it trained on through the whole grace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from elasticd.workers.group import ColdSpawner, Launch, WorkerGroup
from elasticd.workers.proctree.helper import exit_future
from tests.fakes import NoReaper

# Says so when SIGTERM reaches it, and ends; says it is ready once its handler is in place.
WORKER = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    open(sys.argv[1], 'w').write('term')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "open(sys.argv[2], 'w').close()\n"
    "time.sleep(60)\n"
)


class _BeforeSetsidSpawner(ColdSpawner):
    """As a warm worker between its fork and its ``setsid``: in its parent's process group."""

    mode = "warm"

    async def spawn(self, launch: Launch, procs_fd: int | None) -> tuple[int, asyncio.Future[int]]:
        proc = subprocess.Popen(
            list(launch.argv), stdin=subprocess.DEVNULL, stdout=launch.log_fd, stderr=subprocess.STDOUT,
            env=launch.env, close_fds=True,
        )  # fmt: skip
        return proc.pid, exit_future(proc)


def test_a_worker_not_yet_leading_its_process_group_gets_the_stops_sigterm(tmp_path: Path) -> None:
    termed, ready = tmp_path / "termed", tmp_path / "ready"
    log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    argv = (sys.executable, "-c", WORKER, str(termed), str(ready))
    launch = Launch(
        0, 0, argv, dict(os.environ), str(tmp_path), log_fd, tmp_path / "log", tmp_path / "error.json"
    )

    async def run() -> tuple[int, int, list[int]]:
        group = WorkerGroup([launch], NoReaper(), 30.0, spawner=_BeforeSetsidSpawner())  # type: ignore[arg-type]
        await group.start()
        pid = group.workers[0].pid
        assert pid is not None
        try:
            for _ in range(600):
                if ready.exists():
                    break
                await asyncio.sleep(0.05)
            assert os.getpgid(pid) != pid  # killpg(pid) finds no group
            stuck = await group.stop()
            return pid, await group.workers[0].exited, stuck
        finally:
            if group.workers[0].running:
                os.kill(pid, signal.SIGKILL)

    pid, code, stuck = asyncio.run(run())  # (the group closes the log's fd)
    assert termed.read_text() == "term" and code == 0 and stuck == [], (pid, code, stuck)
