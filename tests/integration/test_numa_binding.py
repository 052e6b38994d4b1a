"""--numa-binding on this host's real NUMA layout: each worker's own affinity, read by itself,
is the set the decider gives its rank (forked from the warm zygote, and exec'd cold)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from elasticd.gpu.binding import bind
from elasticd.node.numa import read_host
from tests.conftest import DaemonFactory
from tests.support import log_events, submit_job

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
    got = [json.loads((out / f"aff.{r}.json").read_text())["cpus"] for r in range(2)]
    expected = bind("exclusive", read_host(), [frozenset(), frozenset()], frozenset(os.sched_getaffinity(0)))
    assert got == [sorted(s) if s is not None else sorted(os.sched_getaffinity(0)) for s in expected]
    if len(os.sched_getaffinity(0)) >= 2 and len(read_host().nodes) == 1:
        assert not set(got[0]) & set(got[1])  # exclusive: two ranks on one node share no CPU
