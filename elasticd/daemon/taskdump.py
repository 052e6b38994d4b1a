"""What the daemon is doing, on ``SIGUSR1``: every task's stack in its log, and every thread's.

A daemon that answers but does not act (a scan waiting on something that never comes) shows
nothing in its log: its one event loop is idle or waiting, not failing. ``kill -USR1 <pid>``
writes one ``daemon.task`` event per asyncio task, with where each waits, and the threads' stacks
(``faulthandler``: the calls run off the loop), to the log and stderr. It changes nothing.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import signal
import sys

from elasticd import log

_log = log.get("elasticd.daemon")

MAX_FRAMES = 12  # of each task's stack: where it waits, and the calls that led there


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Dump on ``SIGUSR1`` from now on (on ``loop``, between its callbacks)."""
    loop.add_signal_handler(signal.SIGUSR1, dump)


def dump() -> None:
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    _log.warning("daemon.tasks", count=len(tasks))
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(limit=MAX_FRAMES, file=stack)
        _log.warning("daemon.task", task=task.get_name(), stack=stack.getvalue())
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
