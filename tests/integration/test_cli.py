"""The installed commands as users run them: --version, completion, and unknown names as errors."""

from __future__ import annotations

import subprocess

import pytest

from elasticd import __version__
from tests.support import PYTHON, DaemonProc


@pytest.mark.parametrize("command", ["elasticctl", "elasticd"])
def test_version(command: str) -> None:
    res = subprocess.run([PYTHON, "-m", command, "--version"], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout.strip()) == (0, f"{command} {__version__}"), res.stderr


def test_completion_needs_no_daemon(tmp_path: str) -> None:
    env = {"ELASTICD_SOCKET": "/nonexistent/ctl.sock", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([PYTHON, "-m", "elasticctl", "completion", "bash"], capture_output=True, text=True,
                         timeout=60, env=env)  # fmt: skip
    assert res.returncode == 0 and "complete -o bashdefault -F _shtab_elasticctl elasticctl" in res.stdout
    checked = subprocess.run(["bash", "-n"], input=res.stdout, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("status", "no-such-job"), "[job_not_found]: no job 'no-such-job'"),
        (("status", "no-such-job", "--json"), "[job_not_found]: no job 'no-such-job'"),
        (("kill", "no-such-job"), "[job_not_found]: no job 'no-such-job'"),
        (("logs", "no-such-job"), "[job_not_found]: no job 'no-such-job'"),
        (("logs", "-f", "no-such-job"), "[job_not_found]: no job 'no-such-job'"),
        (("logs", "no-such-job", "--rank", "0"), "[job_not_found]: no job 'no-such-job'"),
        (("drain", "no-such-node"), "[node_not_found]: no live node 'no-such-node'"),
        (("drain", "no-such-node", "--job", "no-such-job"), "no-such-"),
        (("undrain", "no-such-node"), "[node_not_found]: no node 'no-such-node' is live or drained"),
        (("undrain", "no-such-node", "--job", "no-such-job"), "[job_not_found]: no job 'no-such-job'"),
    ],
)
def test_unknown_jobs_and_nodes_are_errors(daemon: DaemonProc, argv: tuple[str, ...], message: str) -> None:
    res = daemon.ctl(*argv, timeout_s=30)
    assert res.returncode == 3, (argv, res.returncode, res.stdout, res.stderr)
    assert res.stdout == "" and message in res.stderr and res.stderr.startswith("elasticctl: error ["), (
        res.stderr
    )


def test_negative_rank_is_a_usage_error(daemon: DaemonProc) -> None:
    res = daemon.ctl("logs", "no-such-job", "--rank", "-1")
    assert res.returncode == 2 and "--rank" in res.stderr, res.stderr
