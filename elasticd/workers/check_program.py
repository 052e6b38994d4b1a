"""A node's pre-flight check, run as the job's user (stdlib only): never imported by the daemon to
run, only read and handed to the job's interpreter (``python -I -c SOURCE MODE ...``), as the
zygote's and the keeper's programs are.

Two modes, each bounded by a deadline it is given:

- ``serve ADDRESS DEADLINE_S``: measure this host's compute (a fixed loop on one core for
  ``COMPUTE_S``: what a throttled, slowed or crowded CPU shows first), listen on ADDRESS (port 0),
  print one JSON line ``{"compute": ITERATIONS_PER_S, "port": PORT}``, then serve peers' checks
  until the deadline: ``p`` answers one byte (latency), ``b`` sends ``BULK`` bytes (bandwidth), at
  most ``MAX_CONNS`` connections in all.
- ``probe DEADLINE_S HOST:PORT...``: against each peer's ``serve``, ``PINGS`` round trips (their
  median) and one bulk read (bytes per second); print one JSON line
  ``{"peers": {"HOST:PORT": {"rtt_s": S, "bytes_per_s": B} | {"error": TEXT}}}``.

What it prints is untrusted to the daemon (``checkrun``: bounded, decoded).
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import threading
import time

COMPUTE_S = 0.3
BULK = 4 << 20
PINGS = 10
MAX_CONNS = 64
IO_TIMEOUT_S = 2.0


def compute_rate(seconds: float = COMPUTE_S) -> float:
    """Iterations per second of a fixed float loop on one core."""
    x, n = 1.0, 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for i in range(5000):
            x = (x * 1.000001 + i) % 1000.0
        n += 5000
        now = time.perf_counter()
        if now >= end:
            return n / (now - start)


def _answer(conn: socket.socket) -> None:
    chunk = bytes(1 << 16)
    with conn:
        conn.settimeout(IO_TIMEOUT_S)
        try:
            while (cmd := conn.recv(1)) in (b"p", b"b"):
                if cmd == b"p":
                    conn.sendall(b"p")
                    continue
                for _ in range(BULK // len(chunk)):
                    conn.sendall(chunk)
        except OSError:
            return


def serve(address: str, deadline_s: float) -> None:
    rate = compute_rate()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as srv:
        srv.bind((address, 0))
        srv.listen(16)
        print(json.dumps({"compute": rate, "port": srv.getsockname()[1]}), flush=True)
        end = time.monotonic() + deadline_s
        for _ in range(MAX_CONNS):
            left = end - time.monotonic()
            if left <= 0:
                return
            srv.settimeout(left)
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_answer, args=(conn,), daemon=True).start()


def _measure(host: str, port: int) -> dict[str, float]:
    with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            conn.sendall(b"p")
            if conn.recv(1) != b"p":
                raise OSError("the peer's check answered out of turn")
            rtts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        conn.sendall(b"b")
        got = 0
        while got < BULK:
            data = conn.recv(1 << 16)
            if not data:
                raise OSError("the peer's check closed early")
            got += len(data)
        took = time.perf_counter() - t0
    return {"rtt_s": statistics.median(rtts), "bytes_per_s": BULK / max(took, 1e-9)}


def probe(deadline_s: float, targets: list[str]) -> None:
    """Each peer in turn (bulk reads side by side would share this host's link), until the
    deadline: a peer not reached by then is left out of the answer, not failed."""
    end = time.monotonic() + deadline_s
    peers: dict[str, dict[str, object]] = {}
    for target in targets:
        if time.monotonic() >= end:
            break
        host, _, port = target.rpartition(":")
        try:
            peers[target] = dict(_measure(host.strip("[]"), int(port)))
        except (OSError, ValueError) as exc:
            peers[target] = {"error": str(exc)[:200] or type(exc).__name__}
    print(json.dumps({"peers": peers}), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        serve(argv[1], float(argv[2]))
        return 0
    if len(argv) >= 2 and argv[0] == "probe":
        probe(float(argv[1]), argv[2:])
        return 0
    print("usage: serve ADDRESS DEADLINE_S | probe DEADLINE_S HOST:PORT...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
