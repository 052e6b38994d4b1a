"""torch's side (``--torch``): the ``DynamicRendezvousHandler`` over ``C10dRendezvousBackend`` on
one ``TCPStore``, one handler per participant, threads of one process; ``get_state``/``set_state``
calls count as its requests."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from elasticd.netaddr import free_port
from rdzvscale.report import Outcome


def _race(participant: Callable[[int], None], n: int, start: threading.Event, timeout_s: float) -> float:
    """Run ``participant(i)`` for each of ``n`` threads, released by ``start`` once every client
    had time to connect; when the clock started (monotonic). Waits for them up to ``timeout_s``."""
    threads = [threading.Thread(target=participant, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # let every client connect before the clock starts
    t0 = time.monotonic()
    start.set()
    for t in threads:
        t.join(max(0.0, t0 + timeout_s - time.monotonic()))
    return t0


def run_torch(n: int, timeout_s: float) -> Outcome:
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # torch does not re-export it
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    port = free_port()
    server = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    run_id = f"scale-{n}"
    counter = {"calls": 0}
    lock = threading.Lock()

    class CountingBackend(C10dRendezvousBackend):
        def get_state(self) -> Any:
            with lock:
                counter["calls"] += 1
            return super().get_state()

        def set_state(self, state: bytes, token: Any = None) -> Any:
            with lock:
                counter["calls"] += 1
            return super().set_state(state, token)

    start = threading.Event()
    done_at: list[float | None] = [None] * n
    errors: list[str] = []

    def participant(i: int) -> None:
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))
            handler = DynamicRendezvousHandler.from_backend(
                run_id, store, CountingBackend(store, run_id), n, n, local_addr=f"node-{i:05d}",
                timeout=RendezvousTimeout(join=timedelta(seconds=timeout_s), last_call=timedelta(seconds=1)),
            )  # fmt: skip
            start.wait()
            handler.next_rendezvous()
            done_at[i] = time.monotonic()
        except Exception as exc:  # a timeout, a store error: the side did not finish
            errors.append(f"{type(exc).__name__}: {exc}"[:200])

    t0 = _race(participant, n, start, timeout_s)
    finished = [d for d in done_at if d is not None]
    seconds = max(finished) - t0 if len(finished) == n else None
    note = errors[0] if errors else ("timed out" if seconds is None else "")
    del server
    outcome = Outcome("torch c10d", n, len(finished), seconds, counter["calls"] / n, note)
    outcome.requests_max = outcome.requests_per_participant  # (a mean: the backend counts all calls)
    return outcome
