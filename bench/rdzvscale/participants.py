"""The processes that play the nodes: threads of ``--procs`` processes, so that no single Python
interpreter carries them all (the harness is not what is measured). Each is the entry point run as
``bench_rdzv_scale.py _node ...`` (``serve``); ``spawn`` starts them and ``collect`` reads their
reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.paths import REPO
from harness.procs import live, stop

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.keys import Keys
from rdzvscale.meter import Meter
from rdzvscale.node import Node, spec_for

ENTRY = Path(__file__).resolve().parents[1] / "bench_rdzv_scale.py"


def serve(argv: list[str]) -> int:
    """One process of participants: ``_node ENDPOINT PREFIX JOB N FIRST COUNT TIMEOUT WATCH PUBLISH``.

    Prints ``ready`` once every participant has its client, lease and watch, starts on a line on
    stdin, and prints one JSON line: per participant its join time, done time (``time.time()``,
    one clock for every process of the host), requests, watch events, and error if any.
    """
    endpoint, prefix, job_id, n_s, first_s, count_s, timeout_s, watch, publish = argv
    n, first, count, timeout = int(n_s), int(first_s), int(count_s), float(timeout_s)
    meter = Meter()
    keys = Keys(prefix)
    spec = spec_for(n, job_id)
    nodes = [
        Node(i, endpoint, keys, spec, watch == "node", publish == "1", meter)
        for i in range(first, first + count)
    ]
    if watch == "process":
        _watch_for(nodes, endpoint, keys)
    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=node.run, args=(timeout,), daemon=True) for node in nodes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    print(json.dumps([node.report() for node in nodes]), flush=True)
    for node in nodes:
        node.close()
    return 0


def _watch_for(nodes: list[Node], endpoint: str, keys: Keys) -> None:
    """One watch stream for the process, fanned out to its nodes' wake-ups."""
    shared = EtcdClient([endpoint], timeout_s=60)

    def fan_out(key: str, deleted: bool) -> None:
        for node in nodes:
            node.on_change(key, deleted)

    for start, end in keys.watched():
        shared.watch_range(start, end, fan_out, lambda: None)


def spawn(
    endpoint: str,
    prefix: str,
    job_id: str,
    n: int,
    procs: int,
    timeout_s: float,
    watch: str,
    publish: bool,
    code: Path = REPO,
) -> list[subprocess.Popen[bytes]]:
    """The processes that play the ``n`` nodes, ``procs`` of them, each ready (a client, a lease and
    a watch per node) and waiting for a ``go`` line. Each in a session of its own, in the harness's
    ``live`` set: the bench stops whatever is left of them when it ends. ``code``: the checkout
    whose elasticd they run (another commit's, for a before/after in one run: ``--versus``)."""
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    entry = code / ENTRY.relative_to(REPO)
    per = -(-n // procs)
    children = []
    for first in range(0, n, per):
        argv = [endpoint, prefix, job_id, str(n), str(first), str(min(per, n - first)), str(timeout_s), watch]
        argv.append("1" if publish else "0")
        child = subprocess.Popen(
            [sys.executable, str(entry), "_node", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: ``stop`` kills the whole of it
        )
        live.add(child)
        children.append(child)
    for c in children:  # every node has its client, lease and watch before the clock starts
        assert c.stdout is not None
        c.stdout.readline()
    return children


def start(children: list[subprocess.Popen[bytes]]) -> None:
    """The ``go`` line to every process of participants."""
    for c in children:
        assert c.stdin is not None
        c.stdin.write(b"go\n")
        c.stdin.flush()


def collect(
    children: list[subprocess.Popen[bytes]], deadline: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every node's report, and the participant processes that failed."""
    reports: list[dict[str, Any]] = []
    errors: list[str] = []
    for c in children:
        try:
            raw, _ = c.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:  # counted as not finished, not a crash of the bench
            stop(c, 1)
            raw, _ = c.communicate()
        live.discard(c)
        found = [line for line in raw.decode(errors="replace").strip().splitlines() if line.startswith("[")]
        if c.returncode != 0 or not found:
            errors.append(f"participant process exited {c.returncode}")
            continue
        try:  # its report is its one JSON line; anything else it printed (a log line) is not
            reports.extend(json.loads(found[-1]))
        except ValueError:
            errors.append("a participant process's report did not read")
    return reports, errors
