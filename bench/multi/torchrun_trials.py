"""bench_multi's torchrun trials: two agents per trial with the c10d rendezvous (the first hosts
the store), an agent's whole tree SIGKILLed (loss) or the other agent SIGTERMed (drain)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
from harness.procs import killpg, live, popen, stop, sweep

from elasticd.netaddr import free_port
from multi.procs import lifetime_cpu, runs_no_worker, torchrun_ranks, tree_pgids
from multi.scenarios import Scenarios
from multi.stamps import round_key, stamps
from multi.trial import DRAIN_AFTER_STEPS, EXAMPLE, MAX_RESTARTS, TORCHRUN_RDZV_CONF, WORKER, Trial


class TorchrunTrials(Scenarios):
    """A trial of each scenario under torchrun."""

    def start_agents(
        self, d: Path, out: Path, script: Path, args: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        port = free_port()
        rdzv_id = f"{self.tag}-{self.seq:03d}"
        agents = {}
        for name, is_host in (("a", 1), ("b", 0)):
            argv = [
                str(self.bin / "torchrun"),
                "--nnodes", "1:2",
                "--nproc-per-node", "1",
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", rdzv_id,
                "--max-restarts", str(MAX_RESTARTS),
                "--monitor-interval", "0.1",
                "--rdzv-conf", f"{TORCHRUN_RDZV_CONF},is_host={is_host}",
                str(script), *args,
            ]  # fmt: skip
            full = self.base_env | env | {"BENCH_NODE": name, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
            agents[name] = SimpleNamespace(proc=popen(argv, env=full, log=d / f"torchrun.{name}.log"))
            if name == "a":
                time.sleep(0.2)  # the store host first; the other one retries until its store is up
        return agents

    def end_torchrun(self, tr: Trial, agents: dict[str, Any], d: Path) -> None:
        tr.launcher_cpu = {n: lifetime_cpu(a.proc.pid) for n, a in agents.items() if a.proc.poll() is None}
        for a in agents.values():
            if a.proc.poll() is None:
                killpg(a.proc, signal.SIGTERM)
        for name, a in agents.items():
            stop(a.proc, 10)  # torchrun SIGTERMs its workers itself; then SIGKILL the group
            tr.launcher_rc[name] = a.proc.returncode
        tr.leftovers_killed = sweep([str(d)], wait_s=3.0)  # workers run in sessions of their own

    def kill_agent(self, tr: Trial, victim: str, agents: dict[str, Any]) -> float:
        proc = agents[victim].proc
        procs, pgids = tree_pgids(proc.pid)  # found before the clock starts
        t_kill = time.time()
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        proc.wait(10)
        live.discard(proc)
        return t_kill

    def run_torchrun_loss(self, variant: str, index: int) -> Trial:
        d, out = self.trial_dir("loss", variant, "torchrun", index)
        tr = Trial("loss", variant, "torchrun", index)
        deadline = time.monotonic() + self.ns.timeout
        t_launch = time.time()
        agents = self.start_agents(d, out, WORKER, ["--tag", str(d)], {"BENCH_OUT": str(out)})
        try:
            self.loss_common(tr, out, deadline, t_launch, survivors=agents, kill=self.kill_agent)
        except RuntimeError as exc:
            tr.note(str(exc))
        finally:
            tr.wall_s = time.time() - t_launch
            tr.rounds_seen = sorted({s.round for s in stamps(out)}, key=round_key)
            self.end_torchrun(tr, agents, d)
        return tr

    def run_torchrun_drain(self, index: int) -> Trial:
        d, out = self.trial_dir("drain", "drain", "torchrun", index)
        tr = Trial("drain", "drain", "torchrun", index)
        deadline = time.monotonic() + self.ns.timeout
        book = out / "ledger"
        t_launch = time.time()
        agents = self.start_agents(d, out, EXAMPLE, self.example_args(out), {"LEDGER": str(book)})
        try:
            self.wait_steps(tr, book, 2, DRAIN_AFTER_STEPS, deadline, agents, t_launch)
            tr.store_host = "a"
            tr.ranks = torchrun_ranks(agents)
            tr.victim = "b"  # the agent that does not host the store
            tr.victim_had_rank0 = tr.ranks.get("0") == "b"

            def request() -> None:
                agents["b"].proc.send_signal(signal.SIGTERM)

            self.drain_common(
                tr, book, deadline, request, {"a": agents["a"]}, idle=lambda: runs_no_worker(agents["a"])
            )
        except RuntimeError as exc:
            tr.note(str(exc))
        finally:
            tr.wall_s = time.time() - t_launch
            self.ledger_result(tr, book)
            self.end_torchrun(tr, agents, d)
        return tr
