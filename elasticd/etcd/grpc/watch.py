"""One watch stream over grpc, read by a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from elasticd import log
from elasticd.etcd import gateway as gw
from elasticd.etcd.gateway import Failure, GatewayError
from elasticd.etcd.grpc.proto import Channel, key_value, status_of
from elasticd.etcd.types import WatchEvent

_log = log.get("elasticd.etcd")
JOIN_S = 5.0


class Watch:
    """One watch stream, read by one thread (``etcd-watch``); cancel and delivery take one lock,
    so no callback runs once ``cancel`` returned (a callback may itself cancel)."""

    def __init__(
        self,
        grpc: Any,
        ch: Channel,
        create: Any,
        metadata: Any,
        on_change: Callable[[str, bool], None] | Callable[[list[WatchEvent]], None],
        on_broken: Callable[[], None],
        whole: bool = False,
    ) -> None:
        self._grpc = grpc
        self._whole = whole  # ``on_change`` takes each answer's events whole
        self._on_change = on_change
        self._on_broken = on_broken
        self._lock = threading.RLock()
        self._over = False
        self._done = threading.Event()  # the request stream may end (cancel)
        self._created = threading.Event()
        self._error: GatewayError | None = None
        self._call = ch.watch.Watch(self._requests(create), metadata=metadata)
        self._thread = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self._thread.start()

    def _requests(self, create: Any) -> Iterator[Any]:
        yield create
        self._done.wait()

    def wait_created(self, timeout_s: float) -> None:
        if not self._created.wait(timeout_s):
            self.cancel()
            raise GatewayError(Failure.UNREACHABLE, f"no answer to a watch within {timeout_s} s")
        if self._error is not None:
            self.cancel()
            raise self._error

    def cancel(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        self._done.set()
        self._call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(JOIN_S)

    def _read(self) -> None:
        why = "etcd ended the stream"
        try:
            for answer in self._call:
                if not self._created.is_set() and (answer.canceled or not answer.created):
                    self._error = gw.watch_canceled(answer.cancel_reason or "the watch was not created")
                    return
                self._created.set()
                if self._whole and answer.events:  # 1: DELETE
                    self._deliver([WatchEvent(key_value(e.kv), e.type == 1) for e in answer.events])
                for event in answer.events if not self._whole else ():
                    self._deliver(event.kv.key.decode("utf-8", "replace"), event.type == 1)
                if answer.canceled:
                    why = f"etcd canceled the watch: {answer.cancel_reason or answer.compact_revision}"
                    break
        except self._grpc.RpcError as exc:
            self._error = status_of(exc)
            why = self._error.message
        finally:
            self._done.set()
            if not self._created.is_set():  # never created: the opener raises, nothing is broken
                self._error = self._error or GatewayError(Failure.UNREACHABLE, why)
                self._created.set()
                return  # noqa: B012  (the opener reports it; no on_broken for a watch never made)
        self._broken(why)

    def _deliver(self, *args: Any) -> None:
        with self._lock:
            if self._over:
                return
            try:
                self._on_change(*args)
            except Exception:  # a watcher's bug: logged; the stream and later events carry on
                _log.exception("watch.callback_failed", key=args[0] if len(args) == 2 else None)

    def _broken(self, why: str) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            _log.info("watch.broken", why=why)
            try:
                self._on_broken()
            except Exception:
                _log.exception("watch.callback_failed", key=None)
