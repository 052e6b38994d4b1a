"""Single-node benchmark: elasticd vs torchrun, side by side, interleaved.

    /work/main/.venv/bin/python bench/bench_single.py [--repeats N] [--restart-repeats M]
                                                    [--only start|restart] [--json PATH]

Scenarios (2 workers, gloo, loopback, OMP_NUM_THREADS=1 for both launchers):

  start    wall time from just before the launch command is started (``elasticctl submit`` to an
           already running, warm daemon / ``torchrun --standalone``) until the LAST rank finished
           its first all_reduce (max over ranks of ``first_collective.a0.r*``).
  restart  rank 1 crashes (``os._exit(1)``) 0.5 s after the first collective of attempt 0; time
           from its ``crash.a0`` stamp until the last rank of the next attempt finished its first
           collective. ``restart(a1)`` uses attempt 1 only (trials where attempt 1 came up on
           every rank); ``restart(recovery)`` uses the first attempt >= 1 that came up on every
           rank, so it also covers trials that needed extra restarts.

Trials alternate elasticd, torchrun, elasticd, torchrun, ... so drift (thermal, page cache,
other load) hits both launchers alike. See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "bench" / "worker.py"
NPROC = 2
MAX_RESTARTS = 3
DAEMON_STOP_GRACE_S = 5  # the daemon's --stop-grace (SIGTERM -> SIGKILL for workers)
DAEMON_SHUTDOWN_S = 20  # SIGTERM to the daemon, then SIGKILL after this long

_ATTEMPT_FILE = re.compile(r"^first_collective\.a(\d+)\.r(\d+)$")
_live: set[subprocess.Popen[bytes]] = set()  # launcher processes to kill if we are interrupted


def _default_bin() -> Path:
    here = Path(sys.executable).parent
    if (here / "elasticd").exists() and (here / "torchrun").exists():
        return here
    return REPO / ".venv" / "bin"


# ----------------------------------------------------------------------------- processes ----
def _popen(argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,  # its own process group: we can kill the whole tree
        )
    _live.add(proc)
    return proc


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace_s``.

    Signals go to the group only while its leader is alive and unreaped (so the group id cannot
    have been reused by someone else); stragglers are left to ``sweep``, which finds our
    processes by the temp dir in their command lines.
    """
    if proc.poll() is None:
        _killpg(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    if proc.poll() is None:
        _killpg(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    _live.discard(proc)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code, or None if it did not exit within ``timeout_s``."""
    try:
        rc = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None
    _live.discard(proc)
    return rc


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _marked(arg: str, marker: str) -> bool:
    """``arg`` is ``marker`` or a path under it (``--x=DIR/...`` too), or ``marker`` is a word in
    it; never a mere prefix match (another run's /tmp/elasticd-bench-abc-2 is not ours)."""
    if marker.startswith("/"):
        return arg == marker or marker + "/" in arg or arg.endswith("=" + marker)
    return marker in arg.replace("=", " ").split()


def own_processes(markers: list[str]) -> list[tuple[int, str]]:
    """Processes whose command line carries one of ``markers`` (our temp dir, our node id)."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        argv = _cmdline(int(entry))
        if argv and any(_marked(a, m) for m in markers for a in argv):
            found.append((int(entry), " ".join(argv)))
    return found


def sweep(markers: list[str], wait_s: float = 0.0) -> list[str]:
    """Give our leftovers ``wait_s`` to go, then SIGKILL them; returns what was killed."""
    deadline = time.monotonic() + wait_s
    while own_processes(markers) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = []
    for pid, cmd in own_processes(markers):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(f"{pid} {cmd}")
    return killed


# ----------------------------------------------------------------------------- results ----
def read_stamp(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def attempts(out: Path) -> dict[int, dict[int, float]]:
    """attempt -> rank -> first-collective time, from the stamps the workers wrote."""
    found: dict[int, dict[int, float]] = {}
    for p in out.iterdir():
        m = _ATTEMPT_FILE.match(p.name)
        if m and (t := read_stamp(p)) is not None:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = t
    return found


def complete(per_rank: dict[int, float] | None) -> float | None:
    """Max over ranks if every rank of the world reported, else None."""
    if not per_rank or sorted(per_rank) != list(range(NPROC)):
        return None
    return max(per_rank.values())


class DaemonDied(RuntimeError):
    pass


def render_daemon_line(line: str, indent: str) -> str:
    """A JSON log record on one line, with its ``exception`` traceback (if any) unfolded below."""
    try:
        rec = json.loads(line)
    except ValueError:
        return indent + line
    if not isinstance(rec, dict) or "exception" not in rec:
        return indent + line
    exc = str(rec.pop("exception"))
    return indent + json.dumps(rec) + "".join(f"\n{indent}  | {x}" for x in exc.splitlines())


@dataclass
class Trial:
    scenario: str
    launcher: str
    index: int  # 1-based trial number within the scenario (0: warm-up)
    ok: bool = False  # the launcher reported success (elasticd SUCCEEDED / torchrun exit 0)
    value_s: float | None = None  # start: launch -> last rank's first collective; restart: a1
    recovery_s: float | None = None  # restart: crash -> first complete attempt >= 1
    recovered_attempt: int | None = None
    restarts: int | None = None
    timed_out: bool = False
    launcher_rc: int | None = None
    wall_s: float | None = None  # launch -> launcher exit
    state: str | None = None  # elasticd job state
    job: str | None = None  # elasticd job id
    zygote: str | None = None  # elasticd: "adopted" (a parked one), "started" (its own), "none"
    attempts_seen: list[int] = field(default_factory=list)
    leftovers_killed: list[str] = field(default_factory=list)
    error: str = ""

    def note(self, message: str) -> None:
        self.error = f"{self.error}; {message}" if self.error else message

    @property
    def flaky(self) -> bool:
        """Restart scenario: the trial failed, or needed more than one restart."""
        return (not self.ok) or self.restarts is None or self.restarts > 1


# ----------------------------------------------------------------------------- launchers ----
class Bench:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.bin = Path(ns.bin)
        self.daemon_args: list[str] = list(ns.daemon_arg)
        self.python = str(self.bin / "python")
        self.tmp = Path(tempfile.mkdtemp(prefix="elasticd-bench-"))
        self.node_id = "bench-" + self.tmp.name.removeprefix("elasticd-bench-")
        self.socket = self.tmp / "ctl.sock"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_err = self.tmp / "daemon.stderr.jsonl"
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICD_")}
        self.base_env |= {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
        self.seq = 0
        self.shutdown_hung = False
        self.stop_offset = 0  # daemon log size when we sent SIGTERM

    @property
    def markers(self) -> list[str]:
        return [str(self.tmp), self.node_id]

    # -- the daemon ---------------------------------------------------------------------------
    def ctl(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        env = self.base_env | {"ELASTICD_SOCKET": str(self.socket)}
        return subprocess.run(
            [str(self.bin / "elasticctl"), *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )

    def start_daemon(self) -> None:
        config = self.tmp / "elasticd.toml"
        config.write_text("# empty: everything comes from flags\n")
        argv = [
            str(self.bin / "elasticd"),
            "--config", str(config),
            "--allow-root-jobs",
            "--socket", str(self.socket),
            "--state-dir", str(self.tmp / "state"),
            "--log-dir", str(self.tmp / "logs"),
            "--node-id", self.node_id,
            "--log-format", "json",
            "--stop-grace", str(DAEMON_STOP_GRACE_S),
            *self.daemon_args,
        ]  # fmt: skip
        with open(self.daemon_err, "wb") as err:
            self.daemon = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=self.base_env | {"PYTHONFAULTHANDLER": "1"},  # SIGABRT dumps its threads
                cwd=self.tmp,
                start_new_session=True,
            )
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if self.daemon.poll() is not None:
                raise DaemonDied(f"elasticd exited with {self.daemon.returncode}:\n{self.daemon_tail()}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self.ctl("--timeout", "2", "ping", timeout_s=10).returncode == 0:
                    flags = f", extra flags {' '.join(self.daemon_args)}" if self.daemon_args else ""
                    took = time.monotonic() - t0
                    print(f"elasticd ready in {took:.1f}s (state in {self.tmp}{flags})", flush=True)
                    return
            time.sleep(0.2)
        raise DaemonDied(f"elasticd did not answer ping within 60 s:\n{self.daemon_tail()}")

    def stop_daemon(self) -> None:
        """SIGTERM; if it has not exited after DAEMON_SHUTDOWN_S, SIGABRT (faulthandler prints every
        thread's stack to its stderr), then SIGKILL."""
        if self.daemon is None:
            return
        if self.daemon.poll() is None:
            since = self.stop_offset = self.daemon_log_size()
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(DAEMON_SHUTDOWN_S)
            except subprocess.TimeoutExpired:
                self.shutdown_hung = True
                print(f"!! elasticd did not exit {DAEMON_SHUTDOWN_S}s after SIGTERM; SIGABRT, then SIGKILL")
                self.daemon.send_signal(signal.SIGABRT)
                try:
                    self.daemon.wait(5)
                except subprocess.TimeoutExpired:
                    self.daemon.kill()
                    self.daemon.wait(10)
                print("!! daemon stderr since SIGTERM (thread stacks from faulthandler last):")
                for line in self.daemon_lines(since=since):
                    print(render_daemon_line(line, "!!   "))
                return
        rc = self.daemon.returncode
        if rc not in (0, -signal.SIGTERM):
            print(f"!! elasticd exited with {rc}:\n{self.daemon_tail()}", flush=True)

    def daemon_log_size(self) -> int:
        try:
            return self.daemon_err.stat().st_size
        except OSError:
            return 0

    def daemon_lines(self, job: str | None = None, levels: tuple[str, ...] = (), since: int = 0) -> list[str]:
        """The daemon's stderr lines (from byte ``since``), optionally only one job's or some levels."""
        try:
            with open(self.daemon_err, "rb") as f:
                f.seek(since)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            if job is not None and job not in line:
                continue
            if levels:
                try:
                    if json.loads(line).get("level") not in levels:
                        continue
                except ValueError:
                    pass  # not JSON (a traceback?): keep it
            out.append(line)
        return out

    def daemon_tail(self, n: int = 30) -> str:
        return "\n".join(self.daemon_lines()[-n:])

    def source(self) -> dict[str, Any]:
        """Which elasticd code the daemon runs (PYTHONPATH may point at another checkout)."""
        probe = "import elasticd, elasticctl; print(elasticd.__file__); print(elasticctl.__file__)"
        out: dict[str, Any] = {"python": self.python}
        try:
            r = subprocess.run(
                [self.python, "-c", probe],
                env=self.base_env,
                cwd=self.tmp,  # like the daemon: not the repo root, which would shadow PYTHONPATH
                capture_output=True,
                text=True,
                timeout=60,
            )
            files = r.stdout.split()
        except subprocess.TimeoutExpired:
            files = []
        if len(files) != 2:
            return out | {"error": "cannot import elasticd"}
        pkg = Path(files[0]).parent
        out["elasticd"] = str(pkg)
        out["elasticctl"] = str(Path(files[1]).parent)
        root = pkg.parent
        digest = hashlib.sha256()
        for base in (pkg, Path(out["elasticctl"])):
            for f in sorted(base.rglob("*.py")):
                digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
        out["code_sha256"] = digest.hexdigest()[:12]  # of elasticd/ + elasticctl/ *.py as measured

        def git(*args: str) -> str:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                r = subprocess.run(
                    ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
                )
                if r.returncode == 0:
                    return r.stdout.strip()
            return ""

        if rev := git("rev-parse", "--short", "HEAD"):
            out["git_head"] = rev
            status = git("status", "--porcelain", "--", "elasticd", "elasticctl")
            out["uncommitted"] = status.splitlines()
        return out

    # -- one trial ----------------------------------------------------------------------------
    def trial_dir(self, scenario: str, launcher: str, index: int) -> tuple[Path, Path]:
        self.seq += 1
        d = self.tmp / "trials" / f"{self.seq:03d}-{scenario}-{launcher}-{index}"
        out = d / "out"
        out.mkdir(parents=True)
        return d, out

    def run_elasticd(self, scenario: str, index: int, timeout_s: float) -> Trial:
        mode = "start" if scenario == "start" else "crash"
        d, out = self.trial_dir(scenario, "elasticd", index)
        tr = Trial(scenario, "elasticd", index)
        # The output dir goes on the command line (not in the environment, for both launchers): a
        # job's environment is part of what makes its zygote, and it is the same for every trial.
        env = self.base_env | {"ELASTICD_SOCKET": str(self.socket)}
        argv = [
            str(self.bin / "elasticctl"), "submit",
            "--nproc-per-node", str(NPROC),
            "--max-restarts", str(MAX_RESTARTS),
            "--python", self.python,
            "--env", "OMP_NUM_THREADS=1",
            "--follow",
            str(WORKER), "--", "--mode", mode, "--tag", str(d), "--out", str(out),
        ]  # fmt: skip
        log = d / "elasticctl.log"
        if self.daemon is None or self.daemon.poll() is not None:
            raise DaemonDied(f"elasticd is not running (exit code {self.daemon and self.daemon.returncode})")
        since = self.daemon_log_size()
        t0 = time.time()
        proc = _popen(argv, env=env, log=log)
        rc = _wait(proc, timeout_s)
        tr.wall_s = time.time() - t0
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        tr.job = lines[0].strip() if lines and re.fullmatch(r"[\w.-]+", lines[0].strip()) else None
        if rc is None:
            tr.timed_out = True
            _stop(proc, 5)
            if tr.job:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    k = self.ctl("kill", tr.job, timeout_s=90)
                    said = (k.stdout + k.stderr).strip()
                    tr.note(f"timed out after {timeout_s:.0f}s; elasticctl kill: {said}")
        tr.launcher_rc = rc
        if tr.job:
            try:
                st = self.ctl("status", tr.job, "--json", timeout_s=30)
                job = json.loads(st.stdout) if st.returncode == 0 else {}
                if st.returncode != 0:
                    tr.note(f"status rc={st.returncode}: {st.stderr.strip()}")
            except (subprocess.TimeoutExpired, ValueError) as exc:
                job = {}
                tr.note(f"status failed: {exc}")
            tr.state, tr.restarts = job.get("state"), job.get("restarts")
        else:
            tr.note("no job id from elasticctl submit: " + " | ".join(lines[-5:]))
        tr.ok = rc == 0 and tr.state == "SUCCEEDED"
        if rc is not None and (rc == 0) != (tr.state == "SUCCEEDED"):
            tr.note(f"elasticctl --follow exited {rc} but the job is {tr.state}")
        self._measure(tr, out, t0)
        tr.zygote = self.zygote_of(tr.job, since)
        tr.leftovers_killed = sweep([str(d)], wait_s=5.0)
        if not tr.ok or tr.leftovers_killed:
            self._explain_elasticd(tr, log, since)
        return tr

    def run_torchrun(self, scenario: str, index: int, timeout_s: float) -> Trial:
        mode = "start" if scenario == "start" else "crash"
        d, out = self.trial_dir(scenario, "torchrun", index)
        tr = Trial(scenario, "torchrun", index)
        env = self.base_env
        argv = [str(self.bin / "torchrun"), "--standalone", "--nproc-per-node", str(NPROC)]
        if mode == "crash":
            argv += ["--max-restarts", str(MAX_RESTARTS), "--monitor-interval", "0.1"]
        argv += [str(WORKER), "--mode", mode, "--tag", str(d), "--out", str(out)]
        log = d / "torchrun.log"
        t0 = time.time()
        proc = _popen(argv, env=env, log=log)
        rc = _wait(proc, timeout_s)
        tr.wall_s = time.time() - t0
        if rc is None:
            tr.timed_out = True
            tr.note(f"timed out after {timeout_s:.0f}s; killed")
            _stop(proc, 10)  # torchrun SIGTERMs its workers itself; then SIGKILL the group
        tr.launcher_rc = rc
        tr.ok = rc == 0
        self._measure(tr, out, t0)
        # Restarts: the highest attempt that left a stamp (attempts that died before their
        # first collective leave none), or the number of failed attempts torchrun logged.
        text = log.read_text(errors="replace") if log.exists() else ""
        failed_attempts = len(re.findall(r"failed \(exitcode: ", text))
        by_files = max(tr.attempts_seen, default=0)
        # Each logged failure was followed by a restart, except the last one of a failed run.
        exhausted = rc is not None and rc != 0
        by_log = max(0, failed_attempts - 1) if exhausted else failed_attempts
        tr.restarts = max(by_files, by_log)
        tr.leftovers_killed = sweep([str(d)], wait_s=5.0)  # workers run in their own sessions
        return tr

    def zygote_of(self, job: str | None, since: int) -> str | None:
        """Where the job's zygote came from, by the daemon's log: adopted from the pool (a previous
        trial's, parked), started for it, or none (cold workers)."""
        if job is None:
            return None
        found = "none"
        for line in self.daemon_lines(job=job, since=since):
            with contextlib.suppress(ValueError, AttributeError):
                event = json.loads(line)
                if event.get("job") == job and event.get("event") == "zygote.adopted":
                    return "adopted"
                if event.get("job") == job and event.get("event") == "zygote.spawned":
                    found = "started"
        return found

    @staticmethod
    def _measure(tr: Trial, out: Path, t0: float) -> None:
        seen = attempts(out)
        tr.attempts_seen = sorted(seen)
        if tr.scenario == "start":
            last = complete(seen.get(0))
            tr.value_s = None if last is None else last - t0
            if last is None:
                tr.note(f"attempt 0 stamps: {seen.get(0, {})}")
            return
        crash = read_stamp(out / "crash.a0")
        if crash is None:
            tr.note("no crash.a0 stamp")
            return
        a1 = complete(seen.get(1))
        tr.value_s = None if a1 is None else a1 - crash
        for attempt in sorted(a for a in seen if a >= 1):
            last = complete(seen[attempt])
            if last is not None:
                tr.recovery_s, tr.recovered_attempt = last - crash, attempt
                break

    def _explain_elasticd(self, tr: Trial, log: Path, since: int) -> None:
        print(
            f"!! elasticd trial {tr.scenario}#{tr.index} job={tr.job} state={tr.state} "
            f"restarts={tr.restarts} rc={tr.launcher_rc} timed_out={tr.timed_out} {tr.error}",
            flush=True,
        )
        for line in tr.leftovers_killed:
            print(f"!!   leftover killed: {line}", flush=True)
        print("!!   daemon stderr during this trial:", flush=True)
        for line in self.daemon_lines(since=since):
            print(render_daemon_line(line, "!!     "), flush=True)
        tail = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
        print("!!   elasticctl output tail:", *(f"!!     {t}" for t in tail), sep="\n", flush=True)

    # -- scenarios ----------------------------------------------------------------------------
    def run_pair(self, scenario: str, index: int, timeout_s: float, trials: list[Trial]) -> None:
        """One trial per launcher, elasticd first; each is appended to ``trials`` as it ends."""
        for launcher in ("elasticd", "torchrun"):
            run = self.run_elasticd if launcher == "elasticd" else self.run_torchrun
            tr = run(scenario, index, timeout_s)
            trials.append(tr)
            print("  " + fmt_trial(tr), flush=True)


# ----------------------------------------------------------------------------- reporting ----
def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def fmt_secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}s"


def fmt_trial(tr: Trial) -> str:
    tag = "warm-up" if tr.index == 0 else f"#{tr.index}"
    status = "ok" if tr.ok else ("TIMEOUT" if tr.timed_out else "FAILED")
    parts = [f"{tr.scenario:<7} {tag:>7} {tr.launcher:<8} {status:<7}"]
    if tr.scenario == "start":
        parts.append(f"start={fmt_secs(tr.value_s)}")
    else:
        parts.append(
            f"a1={fmt_secs(tr.value_s)} recovery={fmt_secs(tr.recovery_s)}"
            f"(attempt {tr.recovered_attempt if tr.recovered_attempt is not None else '-'})"
        )
        parts.append(f"restarts={tr.restarts if tr.restarts is not None else '?'}")
    parts.append(f"attempts={tr.attempts_seen} wall={fmt_secs(tr.wall_s)}")
    if tr.state:
        parts.append(f"state={tr.state}")
    if tr.zygote:
        parts.append(f"zygote={tr.zygote}")
    if tr.leftovers_killed:
        parts.append(f"leftovers_killed={len(tr.leftovers_killed)}")
    if tr.error:
        parts.append(f"({tr.error})")
    return " ".join(parts)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    rows = []
    for scenario, metric in (("start", "value_s"), ("restart", "value_s"), ("restart", "recovery_s")):
        mine = [t for t in trials if t.scenario == scenario and t.index > 0]
        if not mine:
            continue
        name = (
            "start" if scenario == "start" else "restart(a1)" if metric == "value_s" else "restart(recovery)"
        )
        row: dict[str, Any] = {"scenario": name}
        for launcher in ("elasticd", "torchrun"):
            ts = [t for t in mine if t.launcher == launcher]
            samples = [getattr(t, metric) for t in ts if getattr(t, metric) is not None]
            row[launcher] = {
                "median_s": median(samples),
                "min_s": min(samples, default=None),
                "max_s": max(samples, default=None),
                "n": len(samples),
                "trials": len(ts),
                "failed": sum(not t.ok for t in ts),
                "timed_out": sum(t.timed_out for t in ts),
                "flaky": sum(t.flaky for t in ts) if scenario == "restart" else None,
                "samples_s": [getattr(t, metric) for t in ts],
                "zygotes": {z: sum(t.zygote == z for t in ts) for z in ("adopted", "started", "none")}
                if launcher == "elasticd"
                else None,
            }
        e, r = row["elasticd"]["median_s"], row["torchrun"]["median_s"]
        row["ratio"] = e / r if e is not None and r else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'scenario':<18} {'elasticd med(s)':>15} {'torchrun med(s)':>15} {'ratio e/t':>9}  "
        f"{'elasticd n/fail/flaky':>24}  {'torchrun n/fail/flaky':>24}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:

        def counts(s: dict[str, Any]) -> str:
            flaky = "-" if s["flaky"] is None else str(s["flaky"])
            return f"{s['n']}/{s['trials']} fail={s['failed']} flaky={flaky}"

        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(
            f"{row['scenario']:<18} {fmt_s(row['elasticd']['median_s']):>15} "
            f"{fmt_s(row['torchrun']['median_s']):>15} {ratio:>9}  "
            f"{counts(row['elasticd']):>24}  {counts(row['torchrun']):>24}"
        )
    print(
        "  n = trials with a sample / trials run; fail = launcher did not report success "
        "(incl. timeouts); flaky = failed or needed >1 restart"
    )
    for row in rows:
        z = row["elasticd"]["zygotes"]
        print(
            f"  {row['scenario']}: elasticd zygotes adopted from the pool {z['adopted']}, "
            f"started {z['started']}, none {z['none']}"
        )


def print_samples(rows: list[dict[str, Any]]) -> None:
    print("\nsamples (s, in trial order; '-' = no sample):")
    for row in rows:
        for launcher in ("elasticd", "torchrun"):
            vals = " ".join(fmt_s(v) for v in row[launcher]["samples_s"])
            print(f"  {row['scenario']:<18} {launcher:<8} {vals}")


# ----------------------------------------------------------------------------- main ----
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="start trials per launcher (default 5)")
    p.add_argument("--restart-repeats", type=int, help="restart trials per launcher (default: --repeats)")
    p.add_argument("--only", choices=("start", "restart"), help="run one scenario only")
    p.add_argument("--warmup", type=int, default=1, help="untimed start trials per launcher (default 1)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="per start trial (default 60 s)")
    p.add_argument(
        "--restart-timeout",
        type=float,
        default=60.0,
        help="per restart trial: the launcher must finish by then or is killed (default 60 s)",
    )
    p.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra elasticd flag, repeatable (e.g. --daemon-arg=--warm-pool-size=0: every start cold)",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stamps, daemon state)")
    p.add_argument("--bin", default=str(_default_bin()), help="dir with elasticd, elasticctl, torchrun")
    ns = p.parse_args(argv)
    if ns.restart_repeats is None:
        ns.restart_repeats = ns.repeats
    return ns


def _injected_crash(line: str) -> bool:
    """The daemon's warning about the crash we inject (rank 1 of attempt 0 exits 1)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    summary = str(rec.get("summary", ""))
    return (
        rec.get("event") == "worker.failed"
        and rec.get("attempt", rec.get("round", 0)) == 0
        and summary.startswith("rank 1 ")
        and "exit code 1" in summary
    )


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class Run:
    """What one bench run records besides its trials: where, with what, and how it ended."""

    started: float
    load_before: tuple[float, float, float]
    torch_version: str
    source: dict[str, Any]  # the elasticd code measured (``Bench.source``)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    interrupted: bool = False
    aborted: str = ""

    def describe_source(self) -> str:
        desc = str(self.source.get("elasticd", self.source.get("error")))
        if "code_sha256" in self.source:
            desc += f" [code sha256 {self.source['code_sha256']}]"
        if "git_head" in self.source:
            n = len(self.source["uncommitted"])
            desc += f" (git {self.source['git_head']}, {n} uncommitted paths under elasticd/ and elasticctl/)"
        return desc


def loadavg_text(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def installed_torch() -> str:
    try:
        return importlib.metadata.version("torch")  # without importing torch here
    except importlib.metadata.PackageNotFoundError:
        return "?"


def run_trials(bench: Bench, ns: argparse.Namespace, trials: list[Trial], run: Run) -> None:
    """Every planned pair of trials (stopped by ^C, SIGTERM or a dead daemon), then the clean-up."""
    try:
        bench.start_daemon()
        plan = []
        if ns.only in (None, "start"):
            plan += [("start", 0, ns.start_timeout)] * ns.warmup
            plan += [("start", i, ns.start_timeout) for i in range(1, ns.repeats + 1)]
        if ns.only in (None, "restart"):
            plan += [("restart", i, ns.restart_timeout) for i in range(1, ns.restart_repeats + 1)]
        for scenario, index, timeout_s in plan:
            bench.run_pair(scenario, index, timeout_s, trials)
    except KeyboardInterrupt:
        run.interrupted = True
        print("\ninterrupted; cleaning up", flush=True)
    except DaemonDied as exc:
        run.aborted = str(exc)
        print(f"\n!! {exc}; stopping the run", flush=True)
    finally:
        for proc in list(_live):
            _stop(proc, 5)
        bench.stop_daemon()
        killed = sweep(bench.markers, wait_s=3.0)
        for line in killed:
            print(f"!! killed leftover process: {line}", flush=True)


def report_daemon_problems(bench: Bench) -> list[str]:
    """Print the daemon's warnings and errors (but the injected crash's), grouped, and its stderr
    lines that are not log records; all of its warnings and errors, for the JSON output."""
    problems = bench.daemon_lines(levels=("warning", "error", "critical"))
    # (after a hung shutdown, what followed SIGTERM was printed already)
    printed = set(bench.daemon_lines(since=bench.stop_offset)) if bench.shutdown_hung else set()
    not_json = [line for line in problems if not line.startswith("{") and line not in printed]
    unexpected = [line for line in problems if line.startswith("{") and not _injected_crash(line)]
    if unexpected:
        print("\nelasticd warnings/errors (other than the injected rank-1 crash), grouped:")
        groups: dict[tuple[str, str], list[str]] = {}
        for line in unexpected:
            rec = json.loads(line)
            last = str(rec.get("exception", "")).strip().splitlines()[-1:] or [str(rec.get("summary", ""))]
            groups.setdefault((str(rec.get("event")), last[0]), []).append(line)
        for (event, what), lines in groups.items():
            print(f"  {len(lines)}x {event}: {what}")
            print(render_daemon_line(lines[0], "    "))
    if not_json:
        print(f"\nelasticd stderr lines that are not JSON log records ({len(not_json)}):")
        for line in not_json[:40]:
            print(f"  {line}")
        if len(not_json) > 40:
            print(f"  ... {len(not_json) - 40} more in the JSON output")
    return problems


def write_json(
    path: Path, ns: argparse.Namespace, bench: Bench, run: Run, rows: list[dict[str, Any]],
    trials: list[Trial], problems: list[str],
) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "config": {
            "repeats": ns.repeats, "restart_repeats": ns.restart_repeats, "only": ns.only,
            "warmup": ns.warmup, "nproc_per_node": NPROC, "max_restarts": MAX_RESTARTS,
            "daemon_args": ns.daemon_arg,
            "start_timeout_s": ns.start_timeout, "restart_timeout_s": ns.restart_timeout,
        },
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": run.torch_version,
                 "platform": platform.platform()},
        "started_at": run.started,
        "loadavg_start": run.load_before,
        "loadavg_end": run.load_after,
        "interrupted": run.interrupted,
        "aborted": run.aborted,
        "daemon_shutdown_hung": bench.shutdown_hung,
        "daemon_exit_code": bench.daemon.returncode if bench.daemon else None,
        "elasticd_source": run.source,
        "summary": rows,
        "trials": [asdict(t) | {"flaky": t.flaky} for t in trials],
        "daemon_warnings": problems,
    }, indent=2))  # fmt: skip
    print(f"\nwrote {path}")


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    bench = Bench(ns)
    trials: list[Trial] = []
    started, load_before = time.time(), os.getloadavg()
    run = Run(started, load_before, installed_torch(), bench.source())
    print(f"elasticd code: {run.describe_source()}", flush=True)
    run_trials(bench, ns, trials, run)

    rows = summarize(trials)
    run.load_after = os.getloadavg()
    print(
        f"\nelasticd vs torchrun, {NPROC} workers/gloo on {os.cpu_count()} CPUs, torch {run.torch_version}, "
        f"{time.time() - run.started:.0f}s total; load average (1/5/15 min) at start "
        f"{loadavg_text(run.load_before)}, at end {loadavg_text(run.load_after)}\n"
    )
    if rows:
        print_table(rows)
        print_samples(rows)
    problems = report_daemon_problems(bench)
    if ns.json:
        write_json(ns.json, ns, bench, run, rows, trials, problems)
    if bench.shutdown_hung:
        print(f"\n!! elasticd did not exit within {DAEMON_SHUTDOWN_S}s of SIGTERM (see the stacks above)")
    elif bench.daemon is not None and bench.daemon.returncode not in (0, -signal.SIGTERM):
        print(f"\n!! elasticd exited with {bench.daemon.returncode} (see above)")
    keep = ns.keep or bench.shutdown_hung or any(t.launcher == "elasticd" and not t.ok for t in trials)
    if keep:
        print(f"\nkept {bench.tmp} (daemon log: {bench.daemon_err})")
    else:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    return 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
