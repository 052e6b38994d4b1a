"""--numa-binding on this host's real NUMA layout: each worker's own affinity, read by itself,
is the set the decider gives its rank, and its memory policy (read by itself with
``get_mempolicy``, in its main thread and in a thread it starts) prefers its CPUs' node (forked
from the warm zygote, and exec'd cold). A job without the flag keeps the default policy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from elasticd.gpu.binding import bind, memory_nodes
from elasticd.node.numa import read_host
from tests.conftest import DaemonFactory
from tests.support import log_events, submit_job

pytestmark = pytest.mark.slow

MPOL_PREFERRED = 1
AFFINITY = str(Path(__file__).parent.parent / "scripts" / "affinity.py")


@pytest.mark.parametrize("warm", [True, False])
def test_each_rank_runs_on_the_cpus_its_binding_names(
    daemon_factory: DaemonFactory, tmp_path: Path, warm: bool
) -> None:
    d = daemon_factory(None, "--slots", "2")
    out = tmp_path / "out"
    out.mkdir()
    flags = ["--numa-binding", "exclusive", "--nproc-per-node", "2"] + ([] if warm else ["--no-warm"])
    job = submit_job(d, out, *flags, AFFINITY)
    d.wait_state(job, ("SUCCEEDED",))
    assert [e["mode"] for e in log_events(d, "group.spawned", job=job)] == ["warm" if warm else "cold"]
    seen = [json.loads((out / f"aff.{r}.json").read_text()) for r in range(2)]
    got = [s["cpus"] for s in seen]
    host = read_host()
    expected = bind("exclusive", host, [frozenset(), frozenset()], frozenset(os.sched_getaffinity(0)))
    assert got == [sorted(s) if s is not None else sorted(os.sched_getaffinity(0)) for s in expected]
    if len(os.sched_getaffinity(0)) >= 2 and len(host.nodes) == 1:
        assert not set(got[0]) & set(got[1])  # exclusive: two ranks on one node share no CPU
    refused = log_events(d, "numa.mempolicy_refused")
    for rank, s in enumerate(seen):
        nodes = memory_nodes(host, expected[rank])
        want = [MPOL_PREFERRED, sorted(nodes)] if nodes is not None and not refused else [0, []]
        assert s["policy"] == s["thread_policy"] == want, (rank, s, refused)
    if len(host.nodes) == 1 and host.measured:  # this host: node 0, and nothing refused
        assert [s["policy"] for s in seen] == [[MPOL_PREFERRED, [0]]] * 2 and not refused


def test_without_the_flag_a_worker_keeps_the_default_policy(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    d = daemon_factory(None, "--slots", "1")
    out = tmp_path / "out"
    out.mkdir()
    job = submit_job(d, out, "--no-warm", AFFINITY)
    d.wait_state(job, ("SUCCEEDED",))
    assert json.loads((out / "aff.0.json").read_text())["policy"] == [0, []]  # MPOL_DEFAULT
