"""The joins of the round this node leads, as they arrive: the one watch that carries joins.

No daemon's own watch covers joins (``Keys.watched``): with it, every join of a round of N nodes
went to every daemon (N² events to send and decode). Only the round's leader needs them (to close
at MAX, at once when every expected node is in, or after the last call), so ``agent.step``
decides when its agent follows its round's joins (``WatchJoins``) and this carries it out: one
watch at a time, over ``parts/<job>/<round>/join/``, for as long as the step wants it.

Once a watch exists the agent is woken, to read what came before it existed (its read is then
complete: anything later is an event). A watch that breaks is dropped and the agent woken: the
step sees that none is followed (``Local.joins_followed``) and asks for it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from elasticd.etcd.keyref import Change, KeyKind, KeyRef


class JoinRecords(Protocol):
    """What ``JoinWatch`` needs of a job's store."""

    job_id: str

    async def watch_joins(
        self, round_no: int, on_change: Callable[[str, bool], None], on_broken: Callable[[], None]
    ) -> Callable[[], None]: ...


class JoinWatch:
    """Runs on the agent's event loop; the store's callbacks may come from any thread."""

    def __init__(self, store: JoinRecords, wake: Callable[[Change | None], None]) -> None:
        self._store = store
        self._wake = wake
        self.round: int | None = None  # the round whose joins the open watch follows
        self._cancel: Callable[[], None] | None = None
        self._token: object | None = None  # the open watch's: callbacks of older ones are dropped

    async def follow(self, round_no: int | None) -> None:
        """Follow exactly round ``round_no``'s joins (None: none); EtcdUnavailable if the watch
        cannot be opened (the step then asks again)."""
        if round_no == self.round:
            return
        self.close()
        if round_no is None:
            return
        loop = asyncio.get_running_loop()
        token = self._token = object()
        change = Change(self._store.job_id, KeyRef(KeyKind.JOIN, self._store.job_id, round_no), False)

        def on_change(_key: str, deleted: bool) -> None:  # on the KV's thread
            loop.call_soon_threadsafe(self._changed, token, Change(change.job, change.ref, deleted))

        def on_broken() -> None:  # on the KV's thread
            loop.call_soon_threadsafe(self._broken, token)

        opening = asyncio.ensure_future(self._store.watch_joins(round_no, on_change, on_broken))
        try:
            cancel = await asyncio.shield(opening)
        except asyncio.CancelledError:  # the agent is being torn down: close it once it is open
            opening.add_done_callback(_cancel_when_open)
            raise
        if self._token is not token:  # closed meanwhile
            cancel()
            return
        self.round, self._cancel = round_no, cancel
        self._wake(None)

    def close(self) -> None:
        cancel, self._cancel, self.round, self._token = self._cancel, None, None, None
        if cancel is not None:
            cancel()

    def _changed(self, token: object, change: Change) -> None:
        if token is self._token:
            self._wake(change)

    def _broken(self, token: object) -> None:
        if token is self._token:
            self.close()
            self._wake(None)


def _cancel_when_open(opening: asyncio.Future[Callable[[], None]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result()()
