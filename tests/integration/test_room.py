"""Elastic jobs make room: a 2:3 job lends a node to a waiting job of a higher priority by the
graceful drain (no step lost, no restart spent) and grows back to 3 once that job ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DaemonFactory
from tests.integration.test_drain import EXAMPLE, SCRIPTS, ledger, progress
from tests.support import log_events, start_cluster, submit_job, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_an_elastic_job_shrinks_for_a_higher_priority_and_grows_back_losing_no_step(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    steps = 480
    a, _, _ = start_cluster(daemon_factory, 3, "--stop-grace", "20")
    book = tmp_path / "ledger"
    args = ["--steps", str(steps), "--checkpoint", str(tmp_path / "ckpt.pt"), "--every", "100000"]
    elastic = submit_job(
        a, tmp_path, "--nnodes", "2:3", "--last-call", "1", str(EXAMPLE), "--", *args, "--step-time", "0.05",
        env={"LEDGER": str(book)},
    )  # fmt: skip

    def at_world(world: int, more_steps: int) -> None:
        wait_for(lambda: any(w == world for _, w in ledger(book)[-3:]) if book.exists() else False, 90, 0.1,
                 f"training at world {world}")  # fmt: skip
        target = progress(book) + more_steps
        wait_for(lambda: progress(book) >= target, 60, 0.1, f"{more_steps} more steps")

    at_world(3, 10)
    # Each node has 2 slots and the elastic job holds 1 of each: a job of 2 per node fits nowhere.
    urgent = submit_job(
        a,
        tmp_path,
        "--priority",
        "5",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "sleeper.py"),
        env={"SLEEP": "4"},
    )
    at_world(2, 5)
    shrunk = a.job(elastic)
    assert f"shrunk for {urgent}" in shrunk["reason"], shrunk
    done = a.wait_state(urgent, ("SUCCEEDED", "FAILED"), 90)
    assert done["state"] == "SUCCEEDED", done
    at_world(3, 10)  # the lent node came back once the urgent job ended
    final = a.wait_state(elastic, ("SUCCEEDED", "FAILED"), 180)
    assert final["state"] == "SUCCEEDED", final
    assert final["restarts"] == 0  # a lend and a return spend no restart
    entries = ledger(book)
    assert [s for s, _ in entries] == list(range(steps))  # contiguous: no step lost, none twice
    worlds = [w for i, (_, w) in enumerate(entries) if i == 0 or entries[i - 1][1] != w]
    assert worlds == [3, 2, 3]
    assert "shrunk for" not in final["reason"]


@pytest.mark.torch
@pytest.mark.timeout(420)
def test_the_janitor_killed_mid_shrink_leaves_a_state_the_next_one_finishes_and_gives_back(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    steps = 1200  # long enough for a crash's rounds, the lend and the return before the end
    ds = start_cluster(daemon_factory, 3, "--stop-grace", "20")
    book = tmp_path / "ledger"
    args = ["--steps", str(steps), "--checkpoint", str(tmp_path / "ckpt.pt"), "--every", "20"]
    elastic = submit_job(
        ds[0], tmp_path, "--nnodes", "2:3", "--last-call", "1", "--max-restarts", "5", str(EXAMPLE), "--",
        *args, "--step-time", "0.05", env={"LEDGER": str(book)},
    )  # fmt: skip

    def at_world(world: int, more_steps: int, timeout_s: float = 90) -> None:
        wait_for(lambda: any(w == world for _, w in ledger(book)[-3:]) if book.exists() else False,
                 timeout_s, 0.1, f"training at world {world}")  # fmt: skip
        target = progress(book) + more_steps
        wait_for(lambda: progress(book) >= target, 60, 0.1, f"{more_steps} more steps")

    at_world(3, 10)
    urgent = submit_job(ds[0], tmp_path, "--priority", "5", "--nproc-per-node", "2",
                        str(SCRIPTS / "sleeper.py"), env={"SLEEP": "4"})  # fmt: skip
    # The janitor is the daemon that lends: killed right after it wrote the drain record, before
    # the node left or the urgent job started (whether the node lent is its own or another's).
    janitor = wait_for(lambda: next((d for d in ds if log_events(d, "room.lent", job=elastic)), None),
                       60, 0.02, "a node lent")  # fmt: skip
    janitor.kill9()
    for p in janitor.leftovers():  # its workers: a host that died takes them along
        p.kill()
    others = [d for d in ds if d is not janitor]
    wait_for(lambda: any(log_events(d, "janitor.elected") for d in others), 30, 0.1, "a new janitor")
    janitor.start()  # the host comes back (the job lost a member: it needs the node to grow back)
    live = others[0]
    done = live.wait_state(urgent, ("SUCCEEDED", "FAILED"), 120)
    assert done["state"] == "SUCCEEDED", done
    wait_for(lambda: any(log_events(d, "room.given_back", job=elastic) for d in others), 60, 0.1,
             "the next janitor to give the node back")  # fmt: skip
    at_world(3, 10, 120)  # grown back
    assert "shrunk for" not in live.job(elastic)["reason"]  # no lend record left
    final = live.wait_state(elastic, ("SUCCEEDED", "FAILED"), 240)
    assert final["state"] == "SUCCEEDED", final
    # One lend: the next janitor counted the record the killed one wrote, and lent nothing more.
    assert sum(len(log_events(d, "room.lent", job=elastic)) for d in ds) == 1
    entries = ledger(book)
    assert {s for s, _ in entries} == set(range(steps))  # every step done (a crash repeats a few)
    assert min(w for _, w in entries) >= 2  # never below MIN
