"""The steps of bench/gpu_check.sh, each a subcommand that prints what it saw and exits 0 (pass)
or 1 (fail): ``nvml`` reads the real inventory and health counters; ``nccl``, ``numa`` and
``unhealthy`` drive the daemon at ``--socket`` (started by the script, with the NVML shim)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from elasticctl.client import Client
from elasticd.gpu import read
from elasticd.gpu.binding import bind, memory_nodes
from elasticd.gpu.nvml import Nvml
from elasticd.node.inventory import load_nvml
from elasticd.node.numa import device_cpus, read_host
from elasticd.workers.zygote_program.mempolicy import preferred_mode

WORKER = str(Path(__file__).resolve().parent / "gpu_check_worker.py")


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def wait(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def nvml_step(_: argparse.Namespace) -> bool:
    nvml = load_nvml()
    if nvml is None:
        say("pynvml is not installed")
        return False
    gpus, topology = read.read_gpus(nvml)
    if not gpus:
        say("NVML found no GPU")
        return False
    for g in gpus:
        say(f"GPU {g.index}: {g.uuid} {g.name} {g.memory_mib} MiB, bus {g.bus_id}")
        say(f"GPU {g.index}: NVML CPU affinity {_span(g.cpus)}, MIG slices {len(g.mig)}")
    say(f"topology: {[[link.name for link in row] for row in topology.links]}")
    with read.session(nvml):
        for g, handle in zip(gpus, read.handles(nvml), strict=True):
            say(f"GPU {g.index} counters: {read.read_counters(nvml, handle)}")
            say(f"GPU {g.index} usage: {read.read_usage(nvml, handle)}")
    return True


def _span(cpus: tuple[int, ...] | frozenset[int]) -> str:
    return f"{min(cpus)}-{max(cpus)} ({len(cpus)})" if cpus else "none"


def submit(client: Client, out: Path, mode: str, **extra: Any) -> str:
    out.mkdir(parents=True, exist_ok=True)
    job = client.call(
        "submit",
        entry_kind="script",
        entry=WORKER,
        args=[mode],
        cwd=str(out),
        python=sys.executable,
        env=dict(os.environ, OUT=str(out)),
        **extra,
    )
    return str(job["id"])


def state(client: Client, job: str) -> dict[str, Any]:
    return dict(client.call("status", job=job)["job"])


def nccl_step(ns: argparse.Namespace) -> bool:
    client = Client(ns.socket)
    out = ns.work / "nccl"
    started = time.monotonic()
    job = submit(client, out, "nccl", nproc_per_node=1)
    record = wait("the NCCL worker's result", lambda: _json(out / "nccl.0.json"), 240)
    say(f"first collective {time.monotonic() - started:.1f} s after submit: {record}")
    zygote = int(record["ppid"])
    cmdline = Path(f"/proc/{zygote}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    devices = [os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")]
    maps = Path(f"/proc/{zygote}/maps").read_text()
    touched = [d for d in devices if d.startswith("/dev/nvidia")]
    say(f"parent {zygote}: {cmdline[:80]!r}")
    say(f"parent's /dev/nvidia* open: {touched}; libcuda mapped: {'libcuda.so' in maps}")
    (out / "finish").touch()
    final = wait(
        "the job to end", lambda: (s := state(client, job))["state"] in ("SUCCEEDED", "FAILED") and s, 60
    )
    ok = (
        record["sum"] == [1.0] * 4
        and not record["initialised_at_start"]
        and not record["bad_fork"]
        and "elasticd-zygote" in cmdline
        and not touched  # (libcuda may be mapped: a CUDA build of torch can load it at import,
        and final["state"] == "SUCCEEDED"  # which starts no context and opens no device)
    )
    say(f"job {job}: {final['state']}; warm parent without CUDA: {ok}")
    return ok


def numa_step(ns: argparse.Namespace) -> bool:
    client = Client(ns.socket)
    out = ns.work / "numa"
    job = submit(client, out, "affinity", nproc_per_node=1, numa_binding="node", warm=False)
    got = wait("the worker's affinity", lambda: _json(out / "affinity.0.json"), 120)
    wait("the job to end", lambda: state(client, job)["state"] in ("SUCCEEDED", "FAILED"), 60)
    nvml = cast(Nvml, load_nvml())
    gpus, _ = read.read_gpus(nvml)
    gpu_cpus = frozenset(gpus[0].cpus) or device_cpus(gpus[0].bus_id)
    host = read_host()
    expected = bind("node", host, [gpu_cpus], frozenset(os.sched_getaffinity(0)))[0]
    say(f"NUMA nodes {[(n, _span(c)) for n, c in sorted(host.nodes.items())]}; GPU 0 cpus {_span(gpu_cpus)}")
    say(f"rank 0 runs on {_span(frozenset(got['cpus']))}; expected {_span(expected or frozenset())}")
    nodes = memory_nodes(host, expected)
    want = [preferred_mode(nodes), sorted(nodes)] if nodes else [0, []]
    refused = '"numa.mempolicy_refused"' in (ns.work / "daemon.log").read_text(errors="replace")
    note = " (the kernel refused it: the default)" if refused else ""
    say(f"its memory policy {got.get('policy')}; expected {want}{note}")
    policy_ok = got.get("policy") == (want if not refused else [0, []])
    return expected is not None and frozenset(got["cpus"]) == expected and policy_ok


def unhealthy_step(ns: argparse.Namespace) -> bool:
    client = Client(ns.socket)
    out = ns.work / "hold"
    uuid = client.call("nodes")["nodes"][0]["gpu_states"][0]["uuid"]
    node = client.call("nodes")["nodes"][0]["node"]
    job = submit(client, out, "hold", nproc_per_node=1, max_restarts=0)
    wait("the job to hold the GPU", lambda: _json(out / "hold.0.json"), 120)
    ns.shim.write_text(json.dumps({"ecc_uncorrected": {uuid: 1}}))
    gpu = wait("the GPU out of the pool", lambda: (g := _gpu(client, uuid))["state"] == "unhealthy" and g, 30)
    say(f"{uuid}: {gpu['state']}: {gpu['reason']}")
    moved = wait("the job to leave the GPU", lambda: (s := state(client, job))["round"] >= 1 and s, 60)
    say(f"job {job}: {moved['state']} in round {moved['round']}, restarts {moved['restarts']}")
    say(f"its cause: {moved.get('cause')}")
    ns.shim.write_text("{}")
    client.call("undrain", node=node, gpu=uuid)
    wait("the GPU back in the pool", lambda: _gpu(client, uuid)["state"] == "healthy", 30)
    back = wait(
        "the job on the GPU again", lambda: _json(out / f"hold.{state(client, job)['round']}.json"), 120
    )
    say(f"returned; the job runs again on {back['visible']}")
    (out / "finish").touch()
    wait("the job to end", lambda: state(client, job)["state"] in ("SUCCEEDED", "FAILED"), 60)
    return bool(moved["restarts"] == 0 and moved.get("cause") == "gpu")


def _gpu(client: Client, uuid: str) -> dict[str, Any]:
    states = client.call("nodes")["nodes"][0]["gpu_states"]
    return dict(next(g for g in states if g["uuid"] == uuid))


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("step", choices=["nvml", "nccl", "numa", "unhealthy"])
    p.add_argument("--socket", type=Path)
    p.add_argument("--work", type=Path)
    p.add_argument("--shim", type=Path)
    ns = p.parse_args()
    steps = {"nvml": nvml_step, "nccl": nccl_step, "numa": numa_step, "unhealthy": unhealthy_step}
    try:
        return 0 if steps[ns.step](ns) else 1
    except Exception as exc:
        say(f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
