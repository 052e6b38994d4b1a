"""One trial per launcher: elasticd (``elasticctl submit --follow`` to the warm daemon) and
torchrun (``torchrun --standalone``), each measured from the workers' stamps."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from pathlib import Path

from harness.daemonlog import render_daemon_line
from harness.procs import popen, stop, sweep, wait_exit

from single.daemon import BenchDaemon, DaemonDied
from single.report import fmt_trial
from single.trial import MAX_RESTARTS, NPROC, WORKER, Trial, attempts, complete, read_stamp


class Bench(BenchDaemon):
    """The trials, run against the bench's daemon (``BenchDaemon``) or a fresh torchrun each."""

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
        proc = popen(argv, env=env, log=log)
        rc = wait_exit(proc, timeout_s)
        tr.wall_s = time.time() - t0
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        tr.job = lines[0].strip() if lines and re.fullmatch(r"[\w.-]+", lines[0].strip()) else None
        if rc is None:
            tr.timed_out = True
            stop(proc, 5)
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
        proc = popen(argv, env=env, log=log)
        rc = wait_exit(proc, timeout_s)
        tr.wall_s = time.time() - t0
        if rc is None:
            tr.timed_out = True
            tr.note(f"timed out after {timeout_s:.0f}s; killed")
            stop(proc, 10)  # torchrun SIGTERMs its workers itself; then SIGKILL the group
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

    def run_pair(self, scenario: str, index: int, timeout_s: float, trials: list[Trial]) -> None:
        """One trial per launcher, elasticd first; each is appended to ``trials`` as it ends."""
        for launcher in ("elasticd", "torchrun"):
            run = self.run_elasticd if launcher == "elasticd" else self.run_torchrun
            tr = run(scenario, index, timeout_s)
            trials.append(tr)
            print("  " + fmt_trial(tr), flush=True)
