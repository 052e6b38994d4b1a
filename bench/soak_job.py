"""The chaos soak's job: tiny DDP (gloo, CPU) that keeps a ledger of every step it completed.

    SOAK_OUT=DIR  python soak_job.py [--every 25] [--step-time 0.05] [--snapshots]
    (run by elasticd, see soak.py)

The crash-loss contract (what ``soak_check.py`` holds the job to):

- The **ledger** is the list of completed steps (step, world size, round), kept in memory by
  every rank (the same on each: a restore may take any rank's snapshot) as an int64 tensor and
  committed *inside* the checkpoint, with the model state: ``elasticd.worker.save_checkpoint``
  into ``DIR/ckpt.pt`` (a file: temporary file, fsync, rename; or, with ``--snapshots``, a memory
  snapshot that the file follows behind). The ledger and the model state therefore commit
  together, atomically: the committed ledger is exactly the steps the committed model has seen,
  each once, in order, with no gap and no duplicate, whatever kills the job and when.
- A **crash** (kill -9 of a worker, a fenced node, a hung rank killed after its grace) loses the
  steps done since the last commit: they are not in the committed ledger and are run again by the
  next round. Without ``--snapshots`` the job commits to disk every ``--every`` steps, so a crash
  redoes at most ``--every`` steps; with ``--snapshots`` it commits a memory snapshot after every
  step (``load_checkpoint`` resumes from the newest one any of the job's keepers holds), so a crash
  redoes at most the one step in flight.
- A **graceful stop** (SIGTERM from a drain, a node joining, a daemon stop:
  ``elasticd.worker.GracefulStop``) loses nothing: every rank stops after the same step and rank 0
  commits before leaving.
- ``DIR/lives/<pid>`` is each worker's own life line: ``start ROUND RANK NODE TIME`` when the
  process starts (before torch is imported), then ``alive ROUND RANK NODE TIME`` every 0.1 s from a
  thread (it runs while the main thread waits in a collective) and ``step ROUND RANK NODE TIME
  STEP WORLD`` after each step. A process killed stops writing: its last line is within 0.1 s
  of its death. The soak checks from these, not from etcd, that two rounds never had live
  workers at once (``soak_check.check_rounds_disjoint``).
- ``DIR/progress`` is an *uncommitted* log, one line per completed step appended by rank 0
  (``step world round time``), so the soak can see the job advance and measure recovery. After a
  crash it shows the redone steps twice; the soak checks that each rollback is at most the
  commit interval (``--every``, or 1 with ``--snapshots``).

Control files the soak writes into DIR:
- ``finish``: a total step count (written atomically); the job ends after that many steps. Ranks
  agree on it with an all_reduce, so all of them stop after the same step.
- ``hang.<RANK>``: the rank with that global rank removes the file and hangs (sleeps forever,
  ignoring SIGTERM), as a rank stuck in a collective or a dead data loader would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Life:
    """This process's life line (``DIR/lives/<pid>``): started before torch is imported, so a
    worker counts as live from (almost) its first instruction."""

    def __init__(self, out: Path) -> None:
        lives = out / "lives"
        lives.mkdir(exist_ok=True)
        self.tag = (
            f"{os.environ.get('ELASTICD_ROUND', '0')} {os.environ.get('RANK', '-1')} "
            + os.environ.get("ELASTICD_OWNER", "?")
        )
        self._f = open(lives / str(os.getpid()), "a", buffering=1)  # noqa: SIM115 (lives as long as we do)
        self._lock = threading.Lock()
        self.write("start")
        threading.Thread(target=self._beat, name="life", daemon=True).start()

    def write(self, what: str, extra: str = "") -> None:
        with self._lock:
            self._f.write(f"{what} {self.tag} {time.time():.3f}{extra}\n")

    def _beat(self) -> None:
        while True:
            time.sleep(0.1)
            self.write("alive")


LIFE = Life(Path(os.environ["SOAK_OUT"])) if "SOAK_OUT" in os.environ else None

import torch  # noqa: E402 (after the life line has started)
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from elasticd import worker  # noqa: E402

FEATURES = 8
GLOBAL_BATCH = 12  # divisible by 1, 2, 3, 4 and 6 ranks


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def read_target(path: Path) -> int:
    """The total step count the soak asked for, or -1 (not yet)."""
    try:
        return int(path.read_text().strip() or "-1")
    except (OSError, ValueError):
        return -1


def agreed_target(path: Path) -> int:
    """The finish target every rank agrees on (MAX over ranks' reads): a collective."""
    t = torch.tensor([read_target(path)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def hang_forever(trigger: Path) -> None:
    trigger.unlink(missing_ok=True)
    print(f"rank {dist.get_rank()}: hanging on request", flush=True)
    while True:  # SIGTERM only sets GracefulStop's flag: the daemon has to SIGKILL us
        time.sleep(3600)


class Ledger:
    """The completed steps (step, world, round) as rows of an int64 tensor that doubles as it
    grows: a snapshot copies it as one tensor, not a list walked entry by entry."""

    def __init__(self, rows: torch.Tensor | None = None) -> None:
        self._buf = torch.zeros((max(1024, 0 if rows is None else 2 * len(rows)), 3), dtype=torch.int64)
        self.n = 0 if rows is None else len(rows)
        if rows is not None:
            self._buf[: self.n] = rows

    def append(self, step: int, world: int, round_no: int) -> None:
        if self.n == len(self._buf):
            self._buf = torch.cat([self._buf, torch.zeros_like(self._buf)])
        self._buf[self.n] = torch.tensor([step, world, round_no])
        self.n += 1

    def rows(self) -> torch.Tensor:
        return self._buf[: self.n].clone()  # its own storage: a file holds only these rows


@dataclass
class Training:
    """One worker's model, optimizer and ledger: what a checkpoint commits together."""

    model: torch.nn.Linear
    opt: torch.optim.SGD
    ledger: Ledger
    ckpt: Path
    memory: bool  # commit a memory snapshot (else the file, at once)

    @classmethod
    def restore(cls, ckpt: Path, memory: bool) -> tuple[Training, dict[str, Any] | None]:
        """The training as the last commit left it (fresh if none), and that commit."""
        torch.manual_seed(0)
        model = torch.nn.Linear(FEATURES, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        state: dict[str, Any] | None = worker.load_checkpoint(ckpt, memory=memory)
        ledger = Ledger()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            ledger = Ledger(torch.as_tensor(state["ledger"], dtype=torch.int64).reshape(-1, 3))
        return cls(model, opt, ledger, ckpt, memory), state

    def train(self, ddp: DDP, step: int, rank: int, world: int) -> None:
        x, y = batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def commit(self, next_step: int, finished: bool = False) -> None:
        # Tells elasticd it is checkpointing, where this elasticd has it; nothing otherwise.
        checkpointing = getattr(worker, "checkpointing", contextlib.nullcontext)
        with checkpointing():
            worker.save_checkpoint(
                {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": next_step,
                 "ledger": self.ledger.rows(), "finished": finished},
                self.ckpt, memory=self.memory,
            )  # fmt: skip


def note_step(training: Training, progress: Path, step: int, world: int, round_no: int) -> None:
    """Every rank's ledger entry and life line for a completed step; rank 0's progress line."""
    training.ledger.append(step, world, round_no)
    if dist.get_rank() == 0:
        with open(progress, "a") as f:
            f.write(f"{step} {world} {round_no} {time.time():.3f}\n")
    if LIFE is not None:
        LIFE.write("step", f" {step} {world}")


def stopped(training: Training, stop: worker.GracefulStop, finish: Path, step: int) -> bool:
    """Whether the job ends after ``step`` (the soak's target reached) or this worker leaves (asked
    to): either way, committed first."""
    rank = dist.get_rank()
    target = agreed_target(finish)
    if 0 <= target <= step:
        training.commit(step, finished=True)
        if rank == 0:
            print(f"finished: {step} steps", flush=True)
        return True
    if stop.should_stop():
        training.commit(step)
        if rank == 0:
            print(f"asked to leave: committed at step {step}", flush=True)
        return True
    return False


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=int, default=25, help="disk checkpoint (commit) interval in steps")
    p.add_argument("--snapshots", action="store_true", help="commit a memory snapshot after every step")
    p.add_argument("--step-time", type=float, default=0.05, help="pretend each step takes this long")
    args = p.parse_args()
    out = Path(os.environ["SOAK_OUT"])
    round_no = int(os.environ.get("ELASTICD_ROUND", "0"))

    stop = worker.GracefulStop()
    marks = [time.monotonic()]  # where a restart's time goes in the worker: said on resuming
    dist.init_process_group("gloo", init_method="env://")
    marks.append(time.monotonic())
    rank, world = dist.get_rank(), dist.get_world_size()
    hang = out / f"hang.{rank}"
    training, state = Training.restore(out / "ckpt.pt", args.snapshots)
    marks.append(time.monotonic())
    if state is not None and state.get("finished"):
        print(f"rank {rank}: already finished at step {state['step']}", flush=True)
        dist.destroy_process_group()
        return
    step = worker.resume_step(state)
    ddp = DDP(training.model)
    marks.append(time.monotonic())
    if rank == 0:
        spans = zip(("group", "restore", "ddp"), marks, marks[1:], strict=False)
        took = ", ".join(f"{what} {b - a:.3f} s" for what, a, b in spans)
        print(f"round {round_no} world {world}: resuming at step {step} ({took})", flush=True)

    # Progress reports for `elasticctl status` and `submit --hang-timeout`, where this elasticd has
    # them (elasticd.worker.step); nothing otherwise.
    report_step = getattr(worker, "step", lambda n: None)
    while True:
        if hang.exists():
            hang_forever(hang)
        training.train(ddp, step, rank, world)
        time.sleep(args.step_time)
        note_step(training, out / "progress", step, world, round_no)
        step += 1
        report_step(step)
        if stopped(training, stop, out / "finish", step):
            break
        if args.snapshots or step % args.every == 0:
            training.commit(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
