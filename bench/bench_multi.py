"""Multi-node benchmark: elasticd vs torchrun, 2 "nodes" on one host, side by side, interleaved.

    /work/main/.venv/bin/python bench/bench_multi.py [--repeats N] [--only loss|drain] [--json PATH]

Two "nodes" x 1 worker, an elastic job with nnodes 1:2, gloo on loopback. elasticd: two daemons
(own --node-id, --socket, --state-dir, --log-dir) sharing one etcd started by the bench, with
``--lease-ttl 2``; torchrun: two agents with the c10d rendezvous (the first hosts the store).

  loss   after ~2 s at world 2, one node dies by SIGKILL (elasticd: the daemon, its reaper and
         every process marked ELASTICD_OWNER=<node>; torchrun: the agent's process group and its
         workers' process groups). Clock: from the kill until the surviving rank's first
         all_reduce at world 1 (``bench/multi_worker.py`` stamps). Run twice per repeat: the node
         hosting rank 0 (torchrun: the c10d store host) dies, then the other one.
  drain  ``examples/elastic_train.py`` (LEDGER: rank 0 appends "step world" per step); after ~50
         steps at world 2 the node of rank 1 leaves (elasticd: ``elasticctl drain NODE``;
         torchrun: SIGTERM to the agent that does not host the store). Clock: from the request
         until the next ledger line at world 1; and steps lost = ledger lines - distinct steps.

Trials alternate elasticd, torchrun, elasticd, torchrun, ... Every trial gets fresh daemons (or
agents), a fresh temp dir, a fresh etcd prefix and fresh ports. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_single as single
from bench_single import _killpg, _live, _popen, _stop, render_daemon_line, sweep

from elasticd import log as elasticd_log
from elasticd.etcd.embedded import EmbeddedEtcd
from elasticd.netaddr import free_port
from elasticd.workers.proctree import tree as proctree

REPO = single.REPO
WORKER = REPO / "bench" / "multi_worker.py"
EXAMPLE = REPO / "examples" / "elastic_train.py"
LEASE_TTL = 2  # the minimum the daemon accepts
DAEMON_STOP_GRACE_S = 5
DAEMON_SHUTDOWN_S = 20
MAX_RESTARTS = 5
WARM_S = 2.0  # loss: time at world 2 before the kill
DRAIN_AFTER_STEPS = 50  # drain: ledger lines at world 2 before the leave request
STEPS_AFTER_RESUME = 20  # drain: ledger lines at world 1 before the job is killed
TORCHRUN_RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"
POLL_S = 0.01
IDLE_END_S = 5.0  # drain, torchrun: the surviving agent ran no worker this long -> training ended

_STAMP = re.compile(r"^first\.r(\d+(?:\+\d+)?)\.(\d+)$")


# ----------------------------------------------------------------------------- results ----
@dataclass
class Stamp:
    round: str
    rank: int
    time: float
    world: int
    node: str
    pid: int
    launched: float  # the worker script started (before import torch)


def stamps(out: Path) -> list[Stamp]:
    """Every complete stamp (the .json is written after the time file, so both are there)."""
    found = []
    with contextlib.suppress(OSError):
        for p in out.iterdir():
            m = _STAMP.match(p.name)
            if not m:
                continue
            try:
                info = json.loads((out / (p.name + ".json")).read_text())
                found.append(Stamp(m.group(1), int(m.group(2)), float(info["time"]), int(info["world"]),
                                   str(info["node"]), int(info["pid"]), float(info["launched"])))  # fmt: skip
            except (OSError, ValueError, KeyError):
                continue
    return sorted(found, key=lambda s: s.time)


def world2_round(out: Path) -> list[Stamp] | None:
    """The stamps of the last round in which both ranks of a world of 2 did their first collective."""
    by_round: dict[str, dict[int, Stamp]] = {}
    for s in stamps(out):
        if s.world == 2:
            by_round.setdefault(s.round, {})[s.rank] = s
    full = [r for r in by_round.values() if sorted(r) == [0, 1]]
    return (
        sorted(max(full, key=lambda r: max(s.time for s in r.values())).values(), key=lambda s: s.rank)
        if full
        else None
    )


def parse_ledger(text: str) -> list[tuple[int, int]]:
    entries = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            entries.append((int(parts[0]), int(parts[1])))
    return entries


def read_ledger(path: Path) -> list[tuple[int, int]]:
    try:
        return parse_ledger(path.read_text())
    except OSError:
        return []


def read_ledger_stat(path: Path) -> tuple[list[tuple[int, int]], float | None]:
    """The ledger and the time of its last write: the mtime, if no write came between the fstat
    and the read (same size), else None."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except OSError:
        return [], None
    mtime = st.st_mtime_ns / 1e9 if len(data) == st.st_size else None
    return parse_ledger(data.decode(errors="replace")), mtime


@dataclass
class Trial:
    scenario: str  # loss | drain
    variant: str  # loss: rank0 | other; drain: drain
    launcher: str
    index: int
    ok: bool = False  # produced a sample
    # loss: kill -> the survivor's first collective at world 1; drain: request -> first step at world 1
    value_s: float | None = None
    relaunch_s: float | None = None  # kill/request -> the survivor's new worker was launched
    detect_s: float | None = None  # elasticd: kill/request -> the survivor's daemon bumped the round
    survivor_exited: bool = False  # the surviving launcher (torchrun agent / elasticd daemon) exited
    job_ended: bool = False  # drain: the survivor stopped training too and nothing restarted it
    timed_out: bool = False
    steps_lost: int | None = None  # drain: ledger lines - distinct steps
    ledger_lines: int | None = None
    distinct_steps: int | None = None
    last_step_before: int | None = None  # drain: last step at world 2
    resume_step: int | None = None  # drain: first step at world 1
    worlds: list[int] = field(default_factory=list)  # drain: the world size of each ledger segment
    ranks: dict[str, str] = field(default_factory=dict)  # rank -> node, at world 2
    victim: str = ""  # node killed / drained
    victim_had_rank0: bool | None = None
    store_host: str = ""  # torchrun: the agent hosting the c10d store
    recovered_round: str = ""
    rounds_seen: list[str] = field(default_factory=list)
    request_s: float | None = None  # drain: how long `elasticctl drain` took
    job: str | None = None
    state: str | None = None
    restarts: int | None = None
    launcher_rc: dict[str, int | None] = field(default_factory=dict)
    # mean CPU (% of one core) over their lifetime, of the launcher processes alive at the end
    # (elasticd: each daemon; torchrun: each agent), and of the shared etcd during the trial
    launcher_cpu: dict[str, float] = field(default_factory=dict)
    etcd_cpu: float | None = None
    startup_s: float | None = None  # launch -> world 2 up (not a metric)
    wall_s: float | None = None
    leftovers_killed: list[str] = field(default_factory=list)
    error: str = ""

    def note(self, message: str) -> None:
        self.error = f"{self.error}; {message}" if self.error else message

    @property
    def outcome(self) -> str:
        if self.ok:
            return "ok"
        if self.survivor_exited:
            return "survivor-exited"
        if self.job_ended:
            return "job-ended"
        return "timeout" if self.timed_out else "error"


# ----------------------------------------------------------------------------- elasticd ----
class Daemon:
    """One elasticd ("node") of a trial, against the bench's etcd."""

    def __init__(self, bench: Bench, root: Path, node_id: str, prefix: str) -> None:
        self.bench = bench
        self.root = root
        self.node_id = node_id
        self.prefix = prefix
        self.socket = root / "ctl.sock"
        self.err = root / "daemon.stderr.jsonl"
        self.proc: subprocess.Popen[bytes] | None = None
        self.shutdown_hung = False

    def start(self) -> None:
        self.root.mkdir(parents=True)
        config = self.root / "elasticd.toml"
        config.write_text("# empty: everything comes from flags\n")
        argv = [
            str(self.bench.bin / "elasticd"),
            "--config", str(config),
            "--allow-root-jobs",
            "--socket", str(self.socket),
            "--state-dir", str(self.root / "state"),
            "--log-dir", str(self.root / "logs"),
            "--node-id", self.node_id,
            "--etcd-endpoints", self.bench.etcd_endpoint,
            "--etcd-prefix", self.prefix,
            "--address", "127.0.0.1",  # every "node" is this host (left unset: no multi-node job)
            "--lease-ttl", str(LEASE_TTL),
            "--log-format", "json",
            "--stop-grace", str(DAEMON_STOP_GRACE_S),
        ]  # fmt: skip
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=self.bench.base_env | {"PYTHONFAULTHANDLER": "1"},
                cwd=self.root,
                start_new_session=True,
            )

    def ctl(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bench.bin / "elasticctl"), *args],
            env=self.bench.base_env | {"ELASTICD_SOCKET": str(self.socket)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"elasticd {self.node_id} exited with {self.proc and self.proc.returncode}"
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self.ctl("--timeout", "2", "ping", timeout_s=10).returncode == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"elasticd {self.node_id} did not answer ping in time")

    def status(self, job: str) -> dict[str, Any]:
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            st = self.ctl("status", job, "--json", timeout_s=30)
            if st.returncode == 0:
                return dict(json.loads(st.stdout))
        return {}

    def sigterm(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def finish_stop(self) -> None:
        """After ``sigterm``: wait, then SIGABRT (faulthandler dumps the threads), then SIGKILL."""
        if self.proc is None:
            return
        try:
            self.proc.wait(DAEMON_SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            self.shutdown_hung = True
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def lines(self, levels: tuple[str, ...] = ()) -> list[str]:
        try:
            text = self.err.read_text(errors="replace")
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            if levels:
                try:
                    if json.loads(line).get("level") not in levels:
                        continue
                except ValueError:
                    pass  # not JSON (a traceback, a faulthandler dump): keep it
            out.append(line)
        return out


def node_processes(node_id: str) -> list[psutil.Process]:
    """The node's workers (and anything they started), found by elasticd's own owner marker,
    plus its reaper sidecar (``python -m elasticd.workers.proctree.reaper <node>``)."""
    found = proctree.marked(node_id)
    for proc in psutil.process_iter():
        try:
            cmd = proc.cmdline()
        except (psutil.Error, OSError):
            continue
        if "elasticd.workers.proctree.reaper" in cmd and node_id in cmd:
            found.append(proc)
    return found


def lifetime_cpu(pid: int) -> float:
    """Mean CPU use of a live process since it started, in % of one core."""
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        age = time.time() - p.create_time()
    except psutil.Error:
        return float("nan")
    return round(100 * (t.user + t.system) / age, 1) if age > 0 else float("nan")


def tree_pgids(root_pid: int) -> tuple[list[psutil.Process], list[int]]:
    """Descendants of ``root_pid`` and every process group in that tree (torchrun puts each worker
    in a session of its own, so the agent's group alone does not hold them)."""
    try:
        procs = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        procs = []
    pgids = {root_pid}
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgids.add(os.getpgid(p.pid))
    return procs, sorted(pgids)


# ----------------------------------------------------------------------------- the bench ----
def _drain_seen(tr: Trial, daemons: list[Daemon], t_req: float) -> None:
    """When, after the request, a daemon bumped the round (the drained one: it logs the bump it
    made) and the first started the world-1 attempt."""
    bumps = [first_event(x, "round.bumped", t_req) for x in daemons]
    tr.detect_s = min((b for b in bumps if b is not None), default=None)
    starts = [first_event(x, "attempt.started", t_req, world_size=1) for x in daemons]
    tr.relaunch_s = min((b for b in starts if b is not None), default=None)


class Bench:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.bin = Path(ns.bin)
        self.python = str(self.bin / "python")
        self.tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-multi-"))
        self.tag = "bm-" + self.tmp.name.removeprefix("elasticd-bench-multi-")
        self.base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("ELASTICD_", "TORCHELASTIC_"))
        }
        self.base_env |= {
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",
            # jobs run the submitter's `python`: make it the venv's (as with an activated venv)
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.etcd: EmbeddedEtcd | None = None
        self.etcd_endpoint = ""
        self.seq = 0
        self.node_ids: list[str] = []
        self.daemons: list[Daemon] = []  # every daemon started (for the warnings at the end)
        self.shutdown_hung: list[str] = []
        self.etcd_cpu_mark: tuple[float, float] | None = None

    @property
    def markers(self) -> list[str]:
        return [str(self.tmp), *self.node_ids]

    def start_etcd(self) -> None:
        self.etcd = EmbeddedEtcd(self.tmp / "etcd")
        self.etcd.start()
        self.etcd_endpoint = self.etcd.endpoint

    def stop_etcd(self) -> None:
        if self.etcd is not None:
            self.etcd.stop()

    def trial_dir(self, scenario: str, variant: str, launcher: str, index: int) -> tuple[Path, Path]:
        self.seq += 1
        d = self.tmp / "trials" / f"{self.seq:03d}-{scenario}-{variant}-{launcher}-{index}"
        out = d / "out"
        out.mkdir(parents=True)
        return d, out

    # -- elasticd trials ----------------------------------------------------------------------
    def etcd_cpu_since(self, mark: tuple[float, float]) -> float | None:
        """etcd's CPU (% of one core) since ``mark`` (time, cpu seconds)."""
        now = self.etcd_cpu_now()
        if now is None or now[0] <= mark[0]:
            return None
        return round(100 * (now[1] - mark[1]) / (now[0] - mark[0]), 1)

    def etcd_cpu_now(self) -> tuple[float, float] | None:
        proc = getattr(self.etcd, "_proc", None)
        if proc is None:
            return None
        try:
            t = psutil.Process(proc.pid).cpu_times()
        except psutil.Error:
            return None
        return time.monotonic(), t.user + t.system

    def start_daemons(self, d: Path, deadline: float) -> list[Daemon]:
        self.etcd_cpu_mark = self.etcd_cpu_now()
        prefix = f"/bench/{self.tag}/{self.seq:03d}"
        ds = []
        for name in ("a", "b"):
            node = f"{self.tag}-{self.seq:03d}-{name}"
            self.node_ids.append(node)
            ds.append(Daemon(self, d / name, node, prefix))
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
            tr.rounds_seen = sorted({s.round for s in stamps(out)}, key=_round_key)
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

    def loss_common(self, tr: Trial, out: Path, deadline: float, t_launch: float, survivors: dict[str, Any],
                    kill: Any) -> None:  # fmt: skip
        """Wait for world 2, run WARM_S, kill one node, time the survivor's world-1 collective."""
        up = None
        while time.monotonic() < deadline:
            up = world2_round(out)
            if up:
                break
            if dead := [n for n, x in survivors.items() if not _alive(x)]:
                raise RuntimeError(f"{dead} exited before world 2 was up")
            time.sleep(0.05)
        if not up:
            tr.timed_out = True
            raise RuntimeError(f"world 2 not up within {self.ns.timeout:.0f}s (stamps: {stamps(out)})")
        tr.startup_s = max(s.time for s in up) - t_launch
        tr.ranks = {str(s.rank): s.node for s in up}
        time.sleep(max(0.0, max(s.time for s in up) + WARM_S - time.time()))
        nodes = list(survivors)
        if tr.launcher == "torchrun":
            tr.store_host = nodes[0]
            victim = nodes[0] if tr.variant == "rank0" else nodes[1]
        else:
            victim = up[0].node if tr.variant == "rank0" else up[1].node
        survivor = next(n for n in nodes if n != victim)
        tr.victim, tr.victim_had_rank0 = victim, up[0].node == victim
        t_kill = kill(tr, victim, survivors)
        while time.monotonic() < deadline:
            got = [s for s in stamps(out) if s.time > t_kill and s.world == 1 and s.node == survivor]
            if got:
                tr.value_s, tr.recovered_round, tr.ok = got[0].time - t_kill, got[0].round, True
                tr.relaunch_s = got[0].launched - t_kill
                if tr.launcher == "elasticd":
                    tr.detect_s = first_event(survivors[survivor], "round.bumped", t_kill)
                return
            if not _alive(survivors[survivor]):
                tr.survivor_exited = True
                rc = survivors[survivor].proc.returncode
                tr.note(f"survivor {survivor} exited with {rc} {time.time() - t_kill:.1f}s after the kill")
                return
            time.sleep(POLL_S)
        tr.timed_out = True
        tr.note(f"no world-1 collective on {survivor} within the {self.ns.timeout:.0f}s trial timeout")

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

    @staticmethod
    def example_args(out: Path) -> list[str]:
        return [
            "--steps",
            "400",
            "--step-time",
            "0.05",
            "--every",
            "100000",
            "--checkpoint",
            str(out / "ckpt.pt"),
        ]

    def wait_steps(self, tr: Trial, book: Path, world: int, n: int, deadline: float, alive: dict[str, Any],
                   t_launch: float | None = None, since: int = 0) -> None:  # fmt: skip
        """Until the ledger has ``n`` lines at ``world`` (from line ``since`` on)."""
        while time.monotonic() < deadline:
            entries = read_ledger(book)
            at = [e for e in entries[since:] if e[1] == world]
            if len(at) >= n:
                return
            if t_launch is not None and at and tr.startup_s is None:
                tr.startup_s = time.time() - t_launch
            if dead := [k for k, x in alive.items() if not _alive(x)]:
                raise RuntimeError(f"{dead} exited while waiting for {n} steps at world {world}")
            time.sleep(0.05)
        tr.timed_out = True
        raise RuntimeError(f"not {n} steps at world {world} within the {self.ns.timeout:.0f}s trial timeout")

    def drain_common(
        self,
        tr: Trial,
        book: Path,
        deadline: float,
        request: Any,
        survivors: dict[str, Any],
        idle: Any = None,
        daemons: list[Daemon] | None = None,
    ) -> None:
        """Request the leave, then time the first ledger line at world 1; then ~20 more steps.

        ``idle()`` (torchrun): true while the surviving agent runs no worker. If that lasts
        IDLE_END_S with no new step, training ended there too: no resume, the trial stops.
        """
        n_before = len(read_ledger(book))  # world-1 lines before this (a slow start-up) do not count
        t_req = time.time()
        request()
        tr.request_s = time.time() - t_req
        idle_since: float | None = None
        while time.monotonic() < deadline:
            entries, mtime = read_ledger_stat(book)
            now = time.time()  # after the read: the line was there by then
            at1 = [i for i in range(n_before, len(entries)) if entries[i][1] == 1]
            if at1:
                # The ledger is appended once per step: if the world-1 line is the last one, the
                # file's mtime (taken with the same read) is when it was written; else our poll time.
                last = at1[0] == len(entries) - 1 and mtime is not None and t_req <= mtime <= now
                resumed = mtime if last and mtime is not None else now
                tr.value_s, tr.ok = resumed - t_req, True
                if daemons:
                    _drain_seen(tr, daemons, t_req)
                break
            if dead := [k for k, x in survivors.items() if not _alive(x)]:
                tr.survivor_exited = True
                rcs = {k: survivors[k].proc.returncode for k in dead}
                after = time.time() - t_req
                tr.note(f"no step at world 1: the survivor exited {rcs} {after:.1f}s after the request")
                return
            if idle is not None and idle():
                idle_since = idle_since or now
                if now - idle_since >= IDLE_END_S:
                    tr.job_ended = True
                    tr.note(
                        f"no step at world 1: the surviving agent has run no worker since "
                        f"{idle_since - t_req:.1f}s after the request (its worker stopped too) and has "
                        f"not restarted one in {IDLE_END_S:.0f}s; agent still alive"
                    )
                    return
            else:
                idle_since = None
            time.sleep(POLL_S)
        else:
            tr.timed_out = True
            tr.note(f"no step at world 1 within the {self.ns.timeout:.0f}s trial timeout")
            return
        with contextlib.suppress(RuntimeError):
            self.wait_steps(tr, book, 1, STEPS_AFTER_RESUME, min(deadline, time.monotonic() + 30), survivors,
                            since=n_before)  # fmt: skip
        tr.timed_out = False  # the sample is in; a slow tail only shortens the run after it

    @staticmethod
    def ledger_result(tr: Trial, book: Path) -> None:
        entries = read_ledger(book)
        if not entries:
            return
        tr.ledger_lines = len(entries)
        tr.distinct_steps = len({s for s, _ in entries})
        tr.steps_lost = tr.ledger_lines - tr.distinct_steps
        tr.worlds = [w for i, (_, w) in enumerate(entries) if i == 0 or entries[i - 1][1] != w]
        first2 = next((i for i, e in enumerate(entries) if e[1] == 2), len(entries))
        first1 = next((i for i in range(first2, len(entries)) if entries[i][1] == 1), None)
        if first1 is not None:
            tr.resume_step = entries[first1][0]
            before = [s for s, w in entries[:first1] if w == 2]
            tr.last_step_before = before[-1] if before else None

    # -- torchrun trials ----------------------------------------------------------------------
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
            agents[name] = SimpleNamespace(proc=_popen(argv, env=full, log=d / f"torchrun.{name}.log"))
            if name == "a":
                time.sleep(0.2)  # the store host first; the other one retries until its store is up
        return agents

    def end_torchrun(self, tr: Trial, agents: dict[str, Any], d: Path) -> None:
        tr.launcher_cpu = {n: lifetime_cpu(a.proc.pid) for n, a in agents.items() if a.proc.poll() is None}
        for a in agents.values():
            if a.proc.poll() is None:
                _killpg(a.proc, signal.SIGTERM)
        for name, a in agents.items():
            _stop(a.proc, 10)  # torchrun SIGTERMs its workers itself; then SIGKILL the group
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
        _live.discard(proc)
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
            tr.rounds_seen = sorted({s.round for s in stamps(out)}, key=_round_key)
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

    # -- the plan -----------------------------------------------------------------------------
    def run(self, scenario: str, variant: str, launcher: str, index: int) -> Trial:
        if scenario == "loss":
            run = self.run_elasticd_loss if launcher == "elasticd" else self.run_torchrun_loss
            return run(variant, index)
        return self.run_elasticd_drain(index) if launcher == "elasticd" else self.run_torchrun_drain(index)


def first_event(daemon: Daemon, event: str, after: float, **match: Any) -> float | None:
    """Seconds from ``after`` to the daemon's first ``event`` record (with ``match``) logged after it."""
    for line in daemon.lines():
        try:
            rec = json.loads(line)
            if rec.get("event") != event or any(rec.get(k) != v for k, v in match.items()):
                continue
            at = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, AttributeError):
            continue
        if at >= after:
            return at - after
    return None


def _alive(x: Any) -> bool:
    return bool(x.proc is not None and x.proc.poll() is None)


def _round_key(label: str) -> tuple[int, int]:
    base, _, extra = label.partition("+")
    return int(base), int(extra or 0)


def runs_no_worker(agent: Any) -> bool:
    """The torchrun agent has no live child process (no worker)."""
    try:
        children = psutil.Process(agent.proc.pid).children()
    except psutil.Error:
        return True
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def torchrun_ranks(agents: dict[str, Any]) -> dict[str, str]:
    """rank -> agent name, from the workers' environments (children of each agent)."""
    ranks = {}
    for name, a in agents.items():
        procs, _ = tree_pgids(a.proc.pid)
        for p in procs:
            with contextlib.suppress(psutil.Error, OSError):
                env = p.environ()
                if "RANK" in env and "LOCAL_RANK" in env:
                    ranks[env["RANK"]] = name
    return ranks


# ----------------------------------------------------------------------------- reporting ----
ROWS = (
    ("loss", "rank0", "value_s", "loss: node of rank 0/store killed -> survivor at world 1"),
    ("loss", "rank0", "relaunch_s", "  of which: kill -> survivor's new worker launched"),
    ("loss", "other", "value_s", "loss: other node killed -> survivor at world 1"),
    ("loss", "other", "relaunch_s", "  of which: kill -> survivor's new worker launched"),
    ("drain", "drain", "value_s", "drain: leave request -> next step at world 1"),
    ("drain", "drain", "relaunch_s", "  of which: request -> survivor's new worker launched"),
    ("drain", "drain", "steps_lost", "drain: steps lost (ledger lines - distinct steps)"),
)


def fmt_v(v: float | None, metric: str = "value_s") -> str:
    if v is None:
        return "-"
    return str(int(v)) if metric == "steps_lost" else f"{v:.3f}"


def fmt_trial(tr: Trial) -> str:
    status = "ok" if tr.ok else tr.outcome.upper()
    parts = [f"{tr.scenario:<5} {tr.variant:<5} #{tr.index} {tr.launcher:<8} {status:<7}"]
    if tr.scenario == "loss":
        parts.append(
            f"recovery={fmt_v(tr.value_s)}s relaunch={fmt_v(tr.relaunch_s)}s detect={fmt_v(tr.detect_s)}s"
        )
        parts.append(f"victim={tr.victim} (had rank 0: {tr.victim_had_rank0})")
        parts.append(f"ranks@2={tr.ranks} rounds={tr.rounds_seen}")
        if tr.recovered_round:
            parts.append(f"world1-round={tr.recovered_round}")
    else:
        parts.append(
            f"resume={fmt_v(tr.value_s)}s relaunch={fmt_v(tr.relaunch_s)}s detect={fmt_v(tr.detect_s)}s "
            f"lost={fmt_v(tr.steps_lost, 'steps_lost')}"
        )
        parts.append(
            f"lines={tr.ledger_lines} distinct={tr.distinct_steps} last@2={tr.last_step_before} "
            f"first@1={tr.resume_step} worlds={tr.worlds} victim={tr.victim} ranks@2={tr.ranks}"
        )
        if tr.request_s is not None and tr.launcher == "elasticd":
            parts.append(f"drain-cmd={tr.request_s:.2f}s")
    if tr.startup_s is not None:
        parts.append(f"startup={tr.startup_s:.1f}s")
    if tr.launcher_cpu:
        cpu = "/".join(f"{v:.0f}%" for v in tr.launcher_cpu.values())
        parts.append(f"{'daemon' if tr.launcher == 'elasticd' else 'agent'}-cpu={cpu}")
    if tr.etcd_cpu is not None:
        parts.append(f"etcd-cpu={tr.etcd_cpu:.0f}%")
    if tr.state:
        parts.append(f"state={tr.state} restarts={tr.restarts}")
    parts.append(f"wall={fmt_v(tr.wall_s)}s")
    if tr.leftovers_killed:
        parts.append(f"leftovers_killed={len(tr.leftovers_killed)}")
    if tr.error:
        parts.append(f"({tr.error})")
    return " ".join(parts)


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    rows = []
    for scenario, variant, metric, name in ROWS:
        mine = [t for t in trials if t.scenario == scenario and t.variant == variant]
        if not mine:
            continue
        row: dict[str, Any] = {"scenario": name, "metric": metric}
        for launcher in ("elasticd", "torchrun"):
            ts = [t for t in mine if t.launcher == launcher]
            values = [getattr(t, metric) for t in ts]
            samples = [v for v in values if v is not None]
            row[launcher] = {
                "median": statistics.median(samples) if samples else None,
                "min": min(samples, default=None),
                "max": max(samples, default=None),
                "n": len(samples),
                "trials": len(ts),
                "outcomes": {o: sum(t.outcome == o for t in ts) for o in sorted({t.outcome for t in ts})},
                "samples": values,
            }
        e, r = row["elasticd"]["median"], row["torchrun"]["median"]
        row["ratio"] = e / r if e is not None and r else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'scenario':<58} {'elasticd med':>12} {'torchrun med':>12} {'ratio e/t':>9}  "
        f"{'elasticd n (not ok)':<24} {'torchrun n (not ok)':<24}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        unit = "" if row["metric"] == "steps_lost" else "s"

        def counts(s: dict[str, Any]) -> str:
            bad = " ".join(f"{o}={k}" for o, k in s["outcomes"].items() if o != "ok")
            return f"{s['n']}/{s['trials']}" + (f" ({bad})" if bad else "")

        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        e = fmt_v(row["elasticd"]["median"], row["metric"])
        t = fmt_v(row["torchrun"]["median"], row["metric"])
        print(
            f"{row['scenario']:<58} {e + unit:>12} {t + unit:>12} {ratio:>9}  "
            f"{counts(row['elasticd']):<24} {counts(row['torchrun']):<24}"
        )
    print(
        "  n = trials with a sample / trials run. Not ok: survivor-exited = the surviving launcher exited\n"
        "  instead of going on (torchrun: its agent; elasticd: its daemon); job-ended = after the leave the\n"
        "  survivor stopped training too and nothing restarted it (no resume; steps lost then counts the\n"
        "  ledger as it stands); timeout = no result within the trial timeout; error = see the trial line.\n"
        "  ratio e/t < 1: elasticd faster (for steps lost: fewer)."
    )


def cpu_summary(trials: list[Trial]) -> dict[str, float | None]:
    """Median over trials of the launcher processes' own mean CPU (each), and of etcd's."""

    def med(values: list[float]) -> float | None:
        values = [v for v in values if v == v]  # no NaN
        return round(statistics.median(values), 1) if values else None

    return {
        "elasticd_daemon_pct": med(
            [v for t in trials if t.launcher == "elasticd" for v in t.launcher_cpu.values()]
        ),
        "etcd_pct": med([t.etcd_cpu for t in trials if t.etcd_cpu is not None]),
        "torchrun_agent_pct": med(
            [v for t in trials if t.launcher == "torchrun" for v in t.launcher_cpu.values()]
        ),
    }


def print_cpu(cpu: dict[str, float | None]) -> None:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}%"

    print(
        "\nlaunchers' own CPU (mean % of one core over each process's life, median over trials): "
        f"elasticd daemon {pct(cpu['elasticd_daemon_pct'])} each + etcd {pct(cpu['etcd_pct'])}; "
        f"torchrun agent {pct(cpu['torchrun_agent_pct'])} each (the machine has {os.cpu_count()} cores)"
    )


def print_samples(rows: list[dict[str, Any]]) -> None:
    print("\nsamples (in trial order; '-' = no sample):")
    for row in rows:
        for launcher in ("elasticd", "torchrun"):
            vals = " ".join(fmt_v(v, row["metric"]) for v in row[launcher]["samples"])
            print(f"  {row['scenario']:<58} {launcher:<8} {vals}")


# ----------------------------------------------------------------------------- main ----
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="trials per scenario and launcher (default 5)")
    p.add_argument("--only", choices=("loss", "drain"), help="run one scenario only")
    p.add_argument("--timeout", type=float, default=60.0, help="per trial, from launch (default 60 s)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stamps, ledgers)")
    p.add_argument(
        "--bin", default=str(single._default_bin()), help="dir with elasticd, elasticctl, torchrun"
    )
    return p.parse_args(argv)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_trials(bench: Bench, ns: argparse.Namespace, trials: list[Trial], run: single.Run) -> None:
    """Every planned trial, with each launcher (stopped by ^C or SIGTERM), then the clean-up."""
    try:
        bench.start_etcd()
        print(f"etcd at {bench.etcd_endpoint}; temp dir {bench.tmp}", flush=True)
        # warm the page cache (torch), so the first trial is not the one paying for the disk
        subprocess.run(
            [bench.python, "-c", "import torch, torch.distributed"], env=bench.base_env, check=False
        )
        plan = []
        for i in range(1, ns.repeats + 1):
            if ns.only in (None, "loss"):
                plan += [("loss", "rank0", i), ("loss", "other", i)]
            if ns.only in (None, "drain"):
                plan += [("drain", "drain", i)]
        for scenario, variant, index in plan:
            for launcher in ("elasticd", "torchrun"):
                tr = bench.run(scenario, variant, launcher, index)
                trials.append(tr)
                print("  " + fmt_trial(tr), flush=True)
    except KeyboardInterrupt:
        run.interrupted = True
        print("\ninterrupted; cleaning up", flush=True)
    finally:
        for proc in list(_live):
            _stop(proc, 5)
        for daemon in bench.daemons:
            if daemon.alive():
                daemon.sigterm()
                daemon.finish_stop()
        bench.stop_etcd()
        for line in sweep(bench.markers, wait_s=3.0):
            print(f"!! killed leftover process: {line}", flush=True)


def report_daemon_problems(bench: Bench) -> dict[tuple[str, str], list[str]]:
    """Print every daemon's warnings and errors, grouped, and its stderr lines that are not log
    records; the groups, for the JSON output."""
    warnings: dict[tuple[str, str], list[str]] = {}
    not_json: list[str] = []
    for daemon in bench.daemons:
        for line in daemon.lines(levels=("warning", "error", "critical")):
            try:
                rec = json.loads(line)
            except ValueError:
                not_json.append(f"{daemon.node_id}: {line}")
                continue
            last = str(rec.get("exception", "")).strip().splitlines()[-1:] or [
                str(rec.get("summary", rec.get("reason", "")))
            ]
            warnings.setdefault((str(rec.get("event")), last[0][:160]), []).append(
                f"{daemon.node_id}: {line}"
            )
    if warnings:
        print(
            "\nelasticd warnings/errors over all trials, grouped (a killed node makes some of them expected):"
        )
        for (event, what), lines in sorted(warnings.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(lines)}x {event}: {what}")
            print(render_daemon_line(lines[0], "    "))
    if not_json:
        print(f"\nelasticd stderr lines that are not JSON log records ({len(not_json)}):")
        for line in not_json[:40]:
            print(f"  {line}")
    return warnings


def write_json(
    path: Path, ns: argparse.Namespace, bench: Bench, run: single.Run, source_end: dict[str, Any],
    rows: list[dict[str, Any]], cpu: dict[str, float | None], trials: list[Trial],
    warnings: dict[tuple[str, str], list[str]],
) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "config": {
            "repeats": ns.repeats, "only": ns.only, "timeout_s": ns.timeout, "lease_ttl": LEASE_TTL,
            "max_restarts": MAX_RESTARTS, "warm_s": WARM_S, "drain_after_steps": DRAIN_AFTER_STEPS,
            "steps_after_resume": STEPS_AFTER_RESUME, "torchrun_rdzv_conf": TORCHRUN_RDZV_CONF,
            "daemon_stop_grace_s": DAEMON_STOP_GRACE_S,
        },
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": run.torch_version,
                 "platform": platform.platform()},
        "started_at": run.started,
        "loadavg_start": run.load_before,
        "loadavg_end": run.load_after,
        "interrupted": run.interrupted,
        "elasticd_source": run.source,
        "elasticd_source_end": source_end,
        "summary": rows,
        "launcher_cpu": cpu,
        "trials": [asdict(t) | {"outcome": t.outcome} for t in trials],
        "daemon_warnings": {f"{e}: {w}": lines for (e, w), lines in warnings.items()},
        "daemon_shutdown_hung": bench.shutdown_hung,
    }, indent=2))  # fmt: skip
    print(f"\nwrote {path}")


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    elasticd_log.configure("console", "warning")  # the bench's own EmbeddedEtcd: quiet
    bench = Bench(ns)
    trials: list[Trial] = []
    started, load_before = time.time(), os.getloadavg()
    probe = SimpleNamespace(python=bench.python, base_env=bench.base_env, tmp=bench.tmp)
    source = single.Bench.source(probe)  # type: ignore[arg-type]
    run = single.Run(started, load_before, single.installed_torch(), source)
    print(f"elasticd code: {run.describe_source()}", flush=True)
    run_trials(bench, ns, trials, run)

    source_end = single.Bench.source(probe)  # type: ignore[arg-type]
    code_changed = source_end.get("code_sha256") != source.get("code_sha256")
    rows = summarize(trials)
    run.load_after = os.getloadavg()
    print(
        f"\nelasticd vs torchrun, 2 nodes x 1 worker (gloo, loopback) on {os.cpu_count()} CPUs, torch "
        f"{run.torch_version}, {time.time() - started:.0f}s total; load average (1/5/15 min) at start "
        f"{single.loadavg_text(load_before)}, at end {single.loadavg_text(run.load_after)}\n"
    )
    if code_changed:
        print(
            f"!! the elasticd code changed during the run: sha256 {source.get('code_sha256')} at start, "
            f"{source_end.get('code_sha256')} at the end (daemons started later ran the newer code)\n"
        )
    cpu = cpu_summary(trials)
    if rows:
        print_table(rows)
        print_samples(rows)
        print_cpu(cpu)
    warnings = report_daemon_problems(bench)
    if ns.json:
        write_json(ns.json, ns, bench, run, source_end, rows, cpu, trials, warnings)
    if bench.shutdown_hung:
        print(f"\n!! daemons that did not exit within {DAEMON_SHUTDOWN_S}s of SIGTERM: {bench.shutdown_hung}")
    keep = ns.keep or bool(bench.shutdown_hung) or any(t.launcher == "elasticd" and not t.ok for t in trials)
    if keep:
        print(f"\nkept {bench.tmp}")
    else:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    return 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
