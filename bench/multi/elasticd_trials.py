"""bench_multi's elasticd trials: two daemons ("nodes") per trial on the bench's etcd, a job
submitted to one of them, a node SIGKILLed with its workers (loss) or drained (drain)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from harness.daemonlog import render_daemon_line
from harness.procs import sweep

from multi.daemon import Daemon
from multi.procs import lifetime_cpu, node_processes
from multi.scenarios import Scenarios
from multi.stamps import round_key, stamps
from multi.trial import DAEMON_SHUTDOWN_S, DRAIN_AFTER_STEPS, EXAMPLE, MAX_RESTARTS, WORKER, Trial


class ElasticdTrials(Scenarios):
    """A trial of each scenario under elasticd."""

    def start_daemons(self, d: Path, deadline: float) -> list[Daemon]:
        self.etcd_cpu_mark = self.etcd_cpu_now()
        prefix = f"/bench/{self.tag}/{self.seq:03d}"
        ds = []
        for name in ("a", "b"):
            node = f"{self.tag}-{self.seq:03d}-{name}"
            self.node_ids.append(node)
            ds.append(Daemon(self.bin, self.base_env, self.etcd_endpoint, d / name, node, prefix))
        self.daemons += ds
        for daemon in ds:
            daemon.start()
        for daemon in ds:
            daemon.wait_ready(deadline)
        return ds

    def submit(self, via: Daemon, out: Path, script: Path, args: list[str], env: dict[str, str]) -> str:
        argv = [
            "submit",
            "--nnodes", "1:2",
            "--nproc-per-node", "1",
            "--last-call", "1",
            "--max-restarts", str(MAX_RESTARTS),
            "--python", self.python,
        ]  # fmt: skip
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        argv += [str(script), "--", *args]
        res = via.ctl(*argv, timeout_s=60)
        first = res.stdout.splitlines()[0].strip() if res.stdout.strip() else ""
        if res.returncode != 0 or not re.fullmatch(r"[\w.-]+", first):
            raise RuntimeError(
                f"elasticctl submit rc={res.returncode}: {res.stdout.strip()} {res.stderr.strip()}"
            )
        return first

    def end_elasticd(self, tr: Trial, ds: list[Daemon], d: Path) -> None:
        """Status, kill the job, stop both daemons, sweep the trial's leftovers."""
        live = [x for x in ds if x.alive()]
        tr.launcher_cpu = {x.node_id: lifetime_cpu(x.proc.pid) for x in live if x.proc is not None}
        if self.etcd_cpu_mark is not None:
            tr.etcd_cpu = self.etcd_cpu_since(self.etcd_cpu_mark)
        if tr.job and live:
            view = live[0].status(tr.job)
            tr.state, tr.restarts = view.get("state"), view.get("restarts")
            if not tr.ok:
                tr.note(f"status: {tr.state} ({view.get('reason')}; node states {view.get('node_states')})")
            if tr.state not in ("SUCCEEDED", "FAILED", "KILLED"):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    k = live[0].ctl("kill", tr.job, timeout_s=60)
                    if k.returncode != 0:
                        tr.note(f"elasticctl kill rc={k.returncode}: {(k.stdout + k.stderr).strip()}")
        for x in ds:
            x.sigterm()
        for x in ds:
            x.finish_stop()
            if x.shutdown_hung:
                self.shutdown_hung.append(x.node_id)
                tr.note(f"{x.node_id} did not exit within {DAEMON_SHUTDOWN_S}s of SIGTERM")
            tr.launcher_rc[x.node_id] = x.proc.returncode if x.proc else None
        tr.leftovers_killed = sweep([str(d), *(x.node_id for x in ds)], wait_s=3.0)
        if not tr.ok or tr.leftovers_killed or any(x.shutdown_hung for x in ds):
            self.explain_elasticd(tr, ds)

    def explain_elasticd(self, tr: Trial, ds: list[Daemon]) -> None:
        print(
            f"!! elasticd trial {tr.scenario}/{tr.variant}#{tr.index} job={tr.job} state={tr.state} "
            f"restarts={tr.restarts} victim={tr.victim} {tr.error}",
            flush=True,
        )
        for line in tr.leftovers_killed:
            print(f"!!   leftover killed: {line}", flush=True)
        for x in ds:
            print(f"!!   {x.node_id} warnings/errors (daemon log {x.err}):", flush=True)
            for line in x.lines(levels=("warning", "error", "critical"))[-40:]:
                print(render_daemon_line(line, "!!     "), flush=True)

    def run_elasticd_loss(self, variant: str, index: int) -> Trial:
        d, out = self.trial_dir("loss", variant, "elasticd", index)
        tr = Trial("loss", variant, "elasticd", index)
        deadline = time.monotonic() + self.ns.timeout
        ds: list[Daemon] = []
        t_launch = time.time()
        try:
            ds = self.start_daemons(d, deadline)
            t_launch = time.time()
            tr.job = self.submit(ds[0], out, WORKER, ["--tag", str(d)],
                                 {"BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"})  # fmt: skip
            self.loss_common(
                tr, out, deadline, t_launch, survivors={x.node_id: x for x in ds}, kill=self.kill_node
            )
        except RuntimeError as exc:
            tr.note(str(exc))
        finally:
            tr.wall_s = time.time() - t_launch
            tr.rounds_seen = sorted({s.round for s in stamps(out)}, key=round_key)
            self.end_elasticd(tr, ds, d)
        return tr

    def kill_node(self, tr: Trial, victim: str, nodes: dict[str, Any]) -> float:
        daemon: Daemon = nodes[victim]
        procs = node_processes(victim)  # found before the clock starts
        assert daemon.proc is not None
        t_kill = time.time()
        daemon.proc.kill()
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        daemon.proc.wait(10)
        return t_kill

    def run_elasticd_drain(self, index: int) -> Trial:
        d, out = self.trial_dir("drain", "drain", "elasticd", index)
        tr = Trial("drain", "drain", "elasticd", index)
        deadline = time.monotonic() + self.ns.timeout
        ds: list[Daemon] = []
        book = out / "ledger"
        t_launch = time.time()
        try:
            ds = self.start_daemons(d, deadline)
            t_launch = time.time()
            tr.job = self.submit(ds[0], out, EXAMPLE, self.example_args(out),
                                 {"LEDGER": str(book), "OMP_NUM_THREADS": "1"})  # fmt: skip
            by_node = {x.node_id: x for x in ds}
            self.wait_steps(tr, book, 2, DRAIN_AFTER_STEPS, deadline, by_node, t_launch)
            view = ds[0].status(tr.job)
            tr.ranks = {
                str(r): m["node"]
                for m in view.get("members", [])
                for r in range(m["ranks"][0], m["ranks"][1] + 1)
            }
            victim = tr.ranks.get("1") or ds[1].node_id
            tr.victim, tr.victim_had_rank0 = victim, tr.ranks.get("0") == victim
            via = next(x for x in ds if x.node_id != victim)

            def request() -> None:
                res = via.ctl("drain", victim, timeout_s=60)
                if res.returncode != 0:
                    raise RuntimeError(
                        f"elasticctl drain rc={res.returncode}: {(res.stdout + res.stderr).strip()}"
                    )

            self.drain_common(tr, book, deadline, request, {via.node_id: via}, daemons=ds)
        except RuntimeError as exc:
            tr.note(str(exc))
        finally:
            tr.wall_s = time.time() - t_launch
            self.ledger_result(tr, book)
            self.end_elasticd(tr, ds, d)
        return tr
