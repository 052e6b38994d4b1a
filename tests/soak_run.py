"""Run the chaos soak (bench/soak.py) from a test: bounded, and nothing of it left behind.

The soak cleans up after itself; on a timeout it gets SIGTERM (its clean-up runs), then SIGKILL,
and then whatever still carries its temp dir on the command line is killed, and the network
namespaces and bridge it made (it prints their tag) are removed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.netns import remove_tagged
from tests.support import PYTHON, REPO

BENCH = REPO / "bench"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))  # bench/ is scripts, not a package

from bench_single import sweep  # noqa: E402


@dataclass
class SoakRun:
    returncode: int | None
    text: str  # the soak's output
    result: dict[str, Any]  # its --json report ({} when it wrote none)
    leftovers: list[str]  # what had to be killed or removed after it


def run_soak(args: list[str], tmp_path: Path, bound_s: float) -> SoakRun:
    report = tmp_path / "soak.json"
    log = tmp_path / "soak.log"
    argv = [PYTHON, str(BENCH / "soak.py"), *args, "--json", str(report)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    leftovers: list[str] = []
    try:
        proc.wait(bound_s)
    except subprocess.TimeoutExpired:
        leftovers.append(f"the soak ran past {bound_s:.0f}s")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    finally:
        text = log.read_text(errors="replace")
        if m := re.search(r"dir=(\S+)", text):  # the soak's temp dir: anything still carrying it goes
            leftovers += sweep([m.group(1)])
        if m := re.search(r"netns tag=(\w+)", text):
            leftovers += remove_tagged(m.group(1))
    result = json.loads(report.read_text()) if report.exists() else {}
    return SoakRun(proc.returncode, text, result, leftovers)
