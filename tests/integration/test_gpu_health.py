"""An unhealthy GPU, read through a fake NVML the test drives, leaves the pool; its job goes on
without it (no restart spent) and an operator returns it."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from elasticd.daemon.testhooks import FAKE_NVML_ENV
from elasticd.gpu.fakefile import write
from elasticd.netaddr import free_port
from tests import monitoring as mon
from tests.conftest import DaemonFactory
from tests.support import DaemonProc, submit_job, unique, wait_for, wait_round

pytestmark = pytest.mark.slow

MEMBER = str(Path(__file__).parent.parent / "scripts" / "member.py")


def gpu_states(d: DaemonProc) -> list[dict[str, Any]]:
    return list(d.call("nodes")["nodes"][0]["gpu_states"])


def test_an_unhealthy_gpu_leaves_the_pool_and_its_job_moves(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    nvml = tmp_path / "nvml.json"
    spec: dict[str, Any] = {"topology": "pcie_only", "count": 2, "node": "t", "gpus": [{}, {}]}
    write(nvml, spec)
    port = free_port()
    env = {**os.environ, FAKE_NVML_ENV: str(nvml)}
    d = daemon_factory(None, "--gpu-poll", "0.1", "--metrics-address", str(port), env=env)
    out = tmp_path / "out"
    out.mkdir()
    job = submit_job(d, out, "--no-warm", "--nproc-per-node", "1", MEMBER)
    first = wait_round(out, 0, 1)
    assert first[0]["CUDA_VISIBLE_DEVICES"] == "0"

    spec["gpus"][0] = {"ecc_uncorrected": 2}
    write(nvml, spec)
    second = wait_round(out, 1, 1)
    assert second[0]["CUDA_VISIBLE_DEVICES"] == "1"  # the job went on without GPU 0
    view = d.job(job)
    assert view["state"] == "RUNNING" and view["restarts"] == 0
    bad = gpu_states(d)[0]
    assert (bad["uuid"], bad["state"]) == ("GPU-t-0", "unhealthy")
    assert bad["reason"] == "uncorrectable ECC errors: 2 (was 0)"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        scraped = r.read().decode()
    missing = mon.GPU_ONLY - mon.served(scraped)  # the per-GPU metrics the dashboard and rules name
    assert not missing, missing
    assert 'elasticd_gpu_healthy{gpu="0",uuid="GPU-t-0"} 0.0' in scraped, scraped
    held = wait_for(lambda: (g := gpu_states(d)[1])["rank"] is not None and g, 10, what="the rank on GPU 1")
    assert (held["state"], held["job"], held["rank"]) == ("healthy", job, 0)
    shown = d.ctl("nodes")
    assert shown.returncode == 0 and "GPU-t-0" in shown.stdout and "uncorrectable ECC" in shown.stdout
    as_json = json.loads(d.ctl("nodes", "--json").stdout)
    assert as_json["nodes"][0]["gpu_states"][0]["state"] == "unhealthy"
    events = d.call("events", job=job)["events"]
    assert any(e["kind"] == "gpu_unhealthy" and e["fields"]["fault"] == "ecc" for e in events), events
    assert any(e["kind"] == "restart" and "gpu_failed" in e["message"] for e in events), events

    res = d.ctl("undrain", d.node_id, "--gpu", "GPU-t-0")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: gpu_states(d)[0]["state"] == "healthy", 10, what="the GPU back in the pool")
    assert d.ctl("undrain", d.node_id, "--gpu", "GPU-t-0").returncode == 3  # no longer out
    (out / "finish").touch()
    d.wait_state(job, ("SUCCEEDED",))


def test_mig_slices_are_slots_of_mig_jobs_only(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    write(
        nvml,
        {"topology": "pcie_only", "count": 2, "node": "m", "gpus": [{}, {"mig": ["MIG-m-a", "MIG-m-b"]}]},
    )
    d = daemon_factory(None, env={**os.environ, FAKE_NVML_ENV: str(nvml)})
    assert d.call("nodes")["nodes"][0]["slots"] == 3
    too_big = d.ctl("submit", "--mig", "--nproc-per-node", "3", MEMBER)
    assert too_big.returncode == 3 and "asks for 3 MIG slices per node but node" in too_big.stderr
    out_mig, out_whole = tmp_path / "mig", tmp_path / "whole"
    out_mig.mkdir()
    out_whole.mkdir()
    mig_job = submit_job(d, out_mig, "--no-warm", "--mig", "--nproc-per-node", "2", MEMBER)
    whole_job = submit_job(d, out_whole, "--no-warm", "--nproc-per-node", "1", MEMBER)
    assert {r["CUDA_VISIBLE_DEVICES"] for r in wait_round(out_mig, 0, 2)} == {"MIG-m-a,MIG-m-b"}
    assert wait_round(out_whole, 0, 1)[0]["CUDA_VISIBLE_DEVICES"] == "0"
    for out in (out_mig, out_whole):
        (out / "finish").touch()
    d.wait_state(mig_job, ("SUCCEEDED",))
    d.wait_state(whole_job, ("SUCCEEDED",))


def test_an_elastic_job_goes_on_with_the_other_node(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """Two hosts of one GPU each; the GPU of one goes bad: the job goes on at world 1 on the
    other, with no restart spent, while the first waits for a healthy GPU."""
    tag = unique("g")
    files = [tmp_path / f"nvml{i}.json" for i in range(2)]
    for i, f in enumerate(files):
        write(f, {"topology": "pcie_only", "count": 1, "node": f"{tag}{i}", "gpus": [{}]})
    a, b = (
        daemon_factory(
            f"{tag}-{i}", "--lease-ttl", "3", "--gpu-poll", "0.1", env={**os.environ, FAKE_NVML_ENV: str(f)}
        )
        for i, f in enumerate(files)
    )
    out = tmp_path / "out"
    out.mkdir()
    job = submit_job(a, out, "--no-warm", "--nnodes", "1:2", "--last-call", "1", MEMBER)
    assert len(wait_round(out, 0, 2)) == 2
    write(
        files[0], {"topology": "pcie_only", "count": 1, "node": f"{tag}0", "gpus": [{"remap_failed": True}]}
    )
    view = wait_for(
        lambda: (v := b.job(job))["round"] >= 1 and v["world_size"] == 1 and v, 20, what="world 1"
    )
    assert (view["state"], view["restarts"], view["cause"], view["nodes"]) == (
        "RUNNING",
        0,
        "gpu",
        [b.node_id],
    )
    assert wait_round(out, view["round"], 1)[0]["CUDA_VISIBLE_DEVICES"] == "0"
    (out / "finish").touch()
    assert b.wait_state(job, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
