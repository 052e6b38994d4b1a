"""A zygote's requests awaiting its answer: forks (workers and the store host) and checks, by id.

An answer is taken only for a request that waits for one (``zygote`` counts any other as
nonsense); when the zygote goes, every request still waiting fails at once instead of timing out.
"""

from __future__ import annotations

import asyncio

from elasticd.workers.warm.messages import Checked, Forked, ForkFailed
from elasticd.workers.warm.spawn import ZygoteError


class Pending:
    """The requests sent and not answered yet. Methods run on the event-loop thread."""

    def __init__(self) -> None:
        self.forks: dict[int, asyncio.Future[Forked | ForkFailed]] = {}
        self.checks: dict[int, asyncio.Future[Checked]] = {}
        self._next_id = 0

    def __bool__(self) -> bool:
        return bool(self.forks or self.checks)

    def rid(self) -> int:
        """A new request id."""
        rid = self._next_id
        self._next_id += 1
        return rid

    def awaits(self, msg: Forked | ForkFailed | Checked) -> bool:
        """Whether a request of ``msg``'s kind and id waits for it (a fork's answer to a check's
        id does not answer it)."""
        return msg.id in (self.checks if isinstance(msg, Checked) else self.forks)

    def answer(self, msg: Forked | ForkFailed | Checked) -> None:
        """Hand ``msg`` to the request it answers (which waits for it: the caller checked)."""
        if isinstance(msg, Checked):
            answer = self.checks.pop(msg.id)
            if not answer.done():
                answer.set_result(msg)
            return
        fut = self.forks.pop(msg.id)
        if not fut.done():
            fut.set_result(msg)

    def fail_all(self) -> None:
        """The zygote is gone: every fork fails, every check raises ``ZygoteError``."""
        for fut in self.forks.values():
            if not fut.done():
                fut.set_result(ForkFailed(-1, "zygote gone"))
        self.forks.clear()
        for answer in self.checks.values():
            if not answer.done():
                answer.set_exception(ZygoteError("zygote gone"))
        self.checks.clear()
