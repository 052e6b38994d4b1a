"""The bench's own elasticd: started warm once, asked through ``elasticctl``, its JSON log read
back, and stopped (with its threads' stacks if it hangs)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.daemon import start_daemon
from harness.daemonlog import render_daemon_line
from harness.paths import REPO
from harness.runinfo import code_source

from single.trial import DAEMON_SHUTDOWN_S, DAEMON_STOP_GRACE_S


class DaemonDied(RuntimeError):
    pass


class BenchDaemon:
    """The temp dir everything lives in, and the daemon in it (``single.launchers.Bench`` runs
    the trials against it)."""

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
        self.daemon = start_daemon(
            self.bin,
            self.tmp,
            socket=self.socket,
            node_id=self.node_id,
            stop_grace_s=DAEMON_STOP_GRACE_S,
            env=self.base_env,
            err=self.daemon_err,
            extra=list(self.daemon_args),
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
        return code_source(self.python, self.base_env, self.tmp)
