"""Where a participant's requests and bytes are counted: in its etcd client, where they cross the
wire."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import elasticd.etcd.transport as etcd_transport
import elasticd.etcd.watch as etcd_watch
from elasticd.etcd.client import EtcdClient
from elasticd.etcd.types import Found, Query


class Counted(Protocol):
    """What ``Meter`` adds bytes to: a node, or a ``Tally``."""

    read_bytes: int
    written_bytes: int
    watch_bytes: int


class Tally:
    """What ``Meter`` adds a node's bytes to, for a reader that is no participant."""

    def __init__(self) -> None:
        self.read_bytes = self.written_bytes = self.watch_bytes = 0


class Meter:
    """Bytes each node's client moves, counted where they cross the wire: the unary responses
    (``transport.parse_json``, given the body), the request bodies (``Transport.post``) and each
    watch line (``watch.parse_watch``). A unary call runs on its node's thread (``InlineJobStore``);
    a watch line on its stream's thread, which ``watching`` ties to the node that opened it.
    One per process: it patches the etcd client's functions in this process."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._threads: dict[int, Counted] = {}
        transports, watches = vars(etcd_transport), vars(etcd_watch)  # patched in this process only
        parse_json, parse_watch, post = (
            transports["parse_json"],
            watches["parse_watch"],
            etcd_transport.Transport.post,
        )

        def counted_json(data: bytes) -> Any:
            node = getattr(self._local, "node", None)
            if node is not None:
                node.read_bytes += len(data)
            return parse_json(data)

        def counted_post(transport: Any, path: str, body: bytes, token: str | None) -> Any:
            node = getattr(self._local, "node", None)
            if node is not None:
                node.written_bytes += len(body)
            return post(transport, path, body, token)

        def counted_watch(line: bytes) -> Any:
            node = self._threads.get(threading.get_ident())
            if node is not None:
                node.read_bytes += len(line)
                node.watch_bytes += len(line)
            return parse_watch(line)

        transports["parse_json"], watches["parse_watch"] = counted_json, counted_watch
        etcd_transport.Transport.post = counted_post  # type: ignore[method-assign,assignment]

    def running(self, node: Counted | None) -> None:
        """Count this thread's unary requests to ``node`` (None: to no one)."""
        self._local.node = node

    def watching(self, node: Counted, open_watches: Callable[[], Any]) -> Any:
        """Run ``open_watches`` and count the lines of the watch threads it started to ``node``
        (one node opens its watches at a time: in the process's main thread, or as the leader)."""
        before = {t.ident for t in threading.enumerate()}
        out = open_watches()
        for t in threading.enumerate():
            if t.ident not in before and t.ident is not None and t.name == "etcd-watch":
                self._threads[t.ident] = node
        return out


class CountingClient(EtcdClient):
    """Counts every unary etcd request (the one place they all go through)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self._count_lock = threading.Lock()

    def call(self, op: Any) -> Any:
        with self._count_lock:
            self.requests += 1
        return super().call(op)


class MeteredClient(EtcdClient):
    """Counts the response bytes of its reads to ``tally`` (on whichever thread they run: the
    ``ClusterCopy`` hands them to a worker thread)."""

    meter: Meter | None = None
    tally: Tally | None = None

    def read_many(self, queries: Sequence[Query]) -> list[Found]:
        if self.meter is None or self.tally is None:
            return super().read_many(queries)
        self.meter.running(self.tally)
        try:
            return super().read_many(queries)
        finally:
            self.meter.running(None)
