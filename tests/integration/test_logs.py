"""``elasticctl logs`` and ``--follow`` against real daemons: tails, attempts, --since, ranks that do
not exist, exit statuses, the job's life told once per change, progress bars on a terminal, and
the ranks other nodes hold."""

from __future__ import annotations

import datetime
import os
import pty
import re
import select
import subprocess
import threading
import time
from pathlib import Path

import pytest

from elasticd.jobs.ranktext import NO_TIME
from tests.conftest import DaemonFactory
from tests.support import PYTHON, REPO, DaemonProc, start_cluster, submit_job, unique, wait_for, wait_job

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "scripts"
FLAKY = """\
import os, sys, time
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
for i in range(5):
    print(f"a{attempt} r{rank} line {i}", flush=True)
if attempt == "0" and rank == "1":
    time.sleep(0.3)
    print("boom", file=sys.stderr, flush=True)
    sys.exit(3)
"""


def submit(d: DaemonProc, *argv: str, cwd: Path) -> str:
    res = d.ctl("submit", *argv, cwd=cwd)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


def told(stderr: str) -> list[str]:
    """The follower's notes, without their local times (checked to be there)."""
    out = []
    for line in stderr.splitlines():
        m = re.match(r"^elasticctl: (\d\d:\d\d:\d\d) (.*)$", line)
        if m:
            out.append(m.group(2))
    return out


@pytest.mark.timeout(180)
def test_tail_attempt_since_and_ranks_that_do_not_exist(daemon: DaemonProc, tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(FLAKY)
    job = submit(daemon, "--nproc-per-node", "2", "--max-restarts", "1", "flaky.py", cwd=tmp_path)
    res = daemon.ctl("logs", "-f", job)  # until the end, and with its result
    assert res.returncode == 0 and f"{job} SUCCEEDED after 1 restart(s)" in res.stderr, res.stderr

    res = daemon.ctl("logs", job, "--tail", "2")
    assert res.returncode == 0 and res.stdout.splitlines() == [
        "[rank0]: a1 r0 line 3", "[rank0]: a1 r0 line 4", "[rank1]: a1 r1 line 3", "[rank1]: a1 r1 line 4",
    ]  # fmt: skip
    res = daemon.ctl("logs", job, "--tail", "7", "--rank", "1")  # per rank, back into attempt 0
    assert res.stdout.splitlines() == ["[rank1]: a0 r1 line 4", "[rank1]: boom"] + [
        f"[rank1]: a1 r1 line {i}" for i in range(5)
    ]
    res = daemon.ctl("logs", job, "--attempt", "0", "--rank", "1", "-t")
    assert res.stdout.splitlines() == [f"{NO_TIME} [rank1]: a0 r1 line {i}" for i in range(5)] + [
        f"{NO_TIME} [rank1]: boom"
    ]

    # --since picks attempts by when they started here: attempt 1's start leaves attempt 0 out.
    started = (daemon.log_dir / job / "attempt_1").stat().st_mtime - 0.001  # isoformat: microseconds
    res = daemon.ctl("logs", job, "--since", datetime.datetime.fromtimestamp(started).isoformat())
    assert res.returncode == 0 and sorted(res.stdout.splitlines()) == [
        f"[rank{r}]: a1 r{r} line {i}" for r in (0, 1) for i in range(5)
    ]
    assert "attempt(s) 0 started before" in res.stderr
    res = daemon.ctl("logs", job, "--since", "0s")
    assert (res.returncode, res.stdout) == (0, "") and "attempt(s) 0, 1 started before" in res.stderr

    for argv, code in [
        (
            ("--rank", "9"),
            "[rank_not_found]: job {job} has no rank 9: it has at most 2 (1 node(s) x 2 per node)",
        ),
        (("--rank", "9", "-f"), "[rank_not_found]"),  # an error at once, not a wait for ever
        (("--attempt", "5"), "[attempt_not_found]: job {job} has no attempt 5 (its attempts so far: 0-1)"),
        (("--attempt", "5", "-f"), "[attempt_not_found]"),
    ]:
        res = daemon.ctl("logs", job, *argv, timeout_s=30)
        assert res.returncode == 3 and res.stdout == "", (argv, res)
        assert code.format(job=job) in res.stderr, (argv, res.stderr)


def test_logs_follow_exits_with_the_jobs_result(daemon: DaemonProc, tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), FAIL_RANK="0")
    res = daemon.ctl("submit", "--max-restarts", "0", str(SCRIPTS / "fail_rank.py"), env=env)
    job = res.stdout.splitlines()[0]
    res = daemon.ctl("logs", "-f", job)
    assert res.returncode == 4, res
    assert "[rank0]: something went wrong in rank 0" in res.stdout
    assert f"{job} FAILED after 0 restart(s)" in res.stderr and "first failure: rank 0" in res.stderr


class Lines:
    """A child's stream, read line by line in a thread (so a test can wait for a line while the
    child runs)."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line)

    def text(self) -> str:
        self._thread.join(30)
        return "".join(self.lines)


@pytest.mark.timeout(180)
def test_follow_tells_the_jobs_life_once_per_change(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory(None, "--slots", "2")
    (tmp_path / "flaky.py").write_text(FLAKY)
    blocker = submit(d, "--nproc-per-node", "2", str(SCRIPTS / "sleeper.py"),
                     cwd=tmp_path)  # fmt: skip
    d.wait_state(blocker, ("RUNNING",))
    env = dict(os.environ, ELASTICD_SOCKET=str(d.socket))
    proc = subprocess.Popen(
        [PYTHON, "-m", "elasticctl", "submit", "--nproc-per-node", "2", "--max-restarts", "1", "--follow",
         "flaky.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        wait_for(lambda: any("pending: waits for free slots" in x for x in err.lines), 60, 0.1, "the wait")
        assert d.ctl("kill", blocker).returncode == 0
        assert proc.wait(120) == 0, err.text()
    finally:
        if proc.poll() is None:
            proc.kill()
    job = out.text().splitlines()[0]
    node = d.node_id
    notes = told(err.text())
    assert len(notes) == len(set(notes)), notes  # nothing said twice
    expected = [
        "pending: waits for free slots: ",
        f"running: round 0, world size 2 on {node}",
        "restarting: round 1 (restart 1 of 1): a worker failed: "
        f"rank 1 (local 1 on {node}) failed with exit code 3",
        f"running: round 1, world size 2 on {node}",
        f"{job} SUCCEEDED after 1 restart(s)",
    ]
    at = [next((i for i, n in enumerate(notes) if n[: len(e)] == e), -1) for e in expected]
    assert -1 not in at, (notes, at)
    assert at == sorted(at), notes
    assert f"{node} is waiting for 2 free CPU slots (0 of 2 free now)" in notes[at[0]]
    assert "attempt 1" not in err.text()  # the life says it, with its reason
    assert [x for x in out.text().splitlines() if x.startswith("[rank1]: a1")] == [
        f"[rank1]: a1 r1 line {i}" for i in range(5)
    ]


BAR = """\
import os, sys, time
print("start", flush=True)
sys.stderr.write("\\r 10%|#"); sys.stderr.flush()
while not os.path.exists("go"):
    time.sleep(0.05)
sys.stderr.write("\\r 20%|##\\n"); sys.stderr.flush()
print("[rank0]: done", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_progress_bar_reaches_a_terminal_as_it_is_drawn(daemon: DaemonProc, tmp_path: Path) -> None:
    (tmp_path / "bar.py").write_text(BAR)
    master, slave = pty.openpty()
    env = dict(os.environ, ELASTICD_SOCKET=str(daemon.socket))
    argv = [PYTHON, "-m", "elasticctl", "submit", "--follow", "bar.py"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    seen = b""

    def read_until(mark: bytes, timeout_s: float) -> bool:
        nonlocal seen
        deadline = time.monotonic() + timeout_s
        while mark not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 4096)
                except OSError:  # the CLI exited
                    return mark in seen
                if not data:
                    break
                seen += data
        return mark in seen

    try:
        # The bar's first state shows while the worker waits: a partial line, passed through live.
        assert read_until(b"10%|#", 60), seen
        assert seen.endswith(b"[rank0]:  10%|#"), seen
        (tmp_path / "go").touch()
        read_until(b"\x00never", 60)
        assert proc.wait(30) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    # One line, redrawn with its prefix; torch's own prefix not doubled (the pty writes \n as \r\n).
    assert b"[rank0]: start\r\n[rank0]:  10%|#\r[rank0]:  20%|##\r\n[rank0]: done\r\n" in seen, seen


@pytest.mark.timeout(180)
def test_logs_say_which_node_holds_the_other_ranks(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ds = start_cluster(daemon_factory, 2)
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from rank', os.environ['RANK'], flush=True)\n")
    job = submit_job(ds[0], tmp_path, "--nnodes", "2", "--nproc-per-node", "1", "--name", unique("hi"),
                     str(script))  # fmt: skip
    view = wait_job(ds[0], job, lambda v: v["state"] == "SUCCEEDED", "the job to succeed", 90)
    rank_of = {m["node"]: m["ranks"][0] for m in view["members"]}
    here, there = ds[0].node_id, ds[1].node_id
    res = ds[0].ctl("logs", job)
    assert res.returncode == 0 and res.stdout == f"[rank{rank_of[here]}]: hello from rank {rank_of[here]}\n"
    assert (
        f"the logs of rank {rank_of[there]} of {job} are on node {there}: run `elasticctl logs {job}` there"
        in res.stderr
    ), res.stderr
    res = ds[0].ctl("logs", job, "--rank", str(rank_of[there]))
    assert res.returncode == 0 and res.stdout == ""
    assert f"run `elasticctl logs {job} --rank {rank_of[there]}` there" in res.stderr
    res = ds[1].ctl("logs", job, "--rank", str(rank_of[there]))  # there, it is
    assert res.stdout == f"[rank{rank_of[there]}]: hello from rank {rank_of[there]}\n" and res.stderr == ""
    res = ds[0].ctl("logs", job, "--rank", "2")
    assert res.returncode == 3 and "[rank_not_found]" in res.stderr
