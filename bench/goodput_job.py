"""The training script of ``bench_goodput.py``, the same under elasticd and torchrun: 2 gloo ranks,
DDP over a small MLP on the CPU (SGD with momentum), a checkpoint every ``--every`` steps through
``elasticd.worker.save_checkpoint`` (under elasticd with ``snapshot_bytes``: a memory snapshot, the
file behind; under torchrun: the file at once, fsync'd) and ``load_checkpoint`` at start.

    python goodput_job.py --out DIR [--every K] [--hidden 512] [--batch 256] [--calibrate N]

What it writes into ``DIR`` (the bench reads it; on the command line, so the bench finds the
workers it leaves by it):
- ``pid.<RANK>``: this worker's pid and start time (``/proc/PID/stat``'s, in clock ticks: a
  worker elasticd forks from its zygote has the zygote's command line), written at start (atomically):
  the bench SIGKILLs it.
- ``progress``: rank 0's line per completed step: ``step time attempt train_s save_s`` (an
  uncommitted log: after a crash it shows the redone steps again).
- ``finish`` (the bench writes it): every rank stops after the same step (an all_reduce) and exits 0.
- with ``--calibrate N``: N steps without a checkpoint, then 3 checkpoints to the file, and
  ``calib.json`` (median step and save seconds, the state's bytes); nothing else.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from elasticd import worker


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True, help="where it writes, and the bench's files")
    p.add_argument("--every", type=int, default=1, help="a checkpoint every K steps")
    p.add_argument("--hidden", type=int, default=512, help="the MLP's width (its middle layer: 2x)")
    p.add_argument("--batch", type=int, default=256, help="samples per rank and step")
    p.add_argument("--calibrate", type=int, default=0, help="N steps, then time 3 saves, and exit")
    p.add_argument("--init-timeout", type=float, default=15, help="seconds for init_process_group")
    return p.parse_args()


def start_ticks(pid: int) -> int:
    """When the process started, in clock ticks since boot (with its pid: which process it is)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class Trainer:
    """The model, its optimizer and one training step."""

    def __init__(self, hidden: int, batch: int) -> None:
        torch.manual_seed(0)
        h = hidden
        net = torch.nn.Sequential(
            torch.nn.Linear(h, 2 * h), torch.nn.ReLU(), torch.nn.Linear(2 * h, 2 * h), torch.nn.ReLU(),
            torch.nn.Linear(2 * h, h),
        )  # fmt: skip
        self.model = DDP(net)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.hidden, self.batch = hidden, batch

    def step(self, step: int) -> None:
        gen = torch.Generator().manual_seed(step * 2 + dist.get_rank())
        x = torch.randn(self.batch, self.hidden, generator=gen)
        loss = torch.nn.functional.mse_loss(self.model(x), x)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def state(self, next_step: int) -> dict[str, Any]:
        return {"step": next_step, "model": self.model.module.state_dict(), "opt": self.opt.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        self.model.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])


def state_bytes(state: dict[str, Any]) -> int:
    """The bytes of the state's tensors (model and optimizer)."""
    total = 0
    stack: list[Any] = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    return total


def calibrate(trainer: Trainer, out: Path, steps: int) -> None:
    """The step's and the file checkpoint's times, with nothing else running in the job."""
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        trainer.step(step)
        times.append(time.perf_counter() - t0)
    saves = []
    for _ in range(3):
        t0 = time.perf_counter()
        worker.save_checkpoint(trainer.state(steps), out / "calib.pt", memory=False)
        saves.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        steady = times[len(times) // 3 :]  # past the first steps' warm-up
        calib = {"step_s": statistics.median(steady), "save_s": statistics.median(saves),
                 "state_bytes": state_bytes(trainer.state(steps))}  # fmt: skip
        write_atomic(out / "calib.json", json.dumps(calib))
        (out / "calib.pt").unlink(missing_ok=True)


def finished(out: Path) -> bool:
    """Whether the bench asked the job to end: every rank agrees (MAX), so all stop together."""
    flag = torch.tensor([1 if (out / "finish").exists() else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def train(trainer: Trainer, out: Path, every: int, start: int) -> None:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank = dist.get_rank()
    progress = open(out / "progress", "a", buffering=1) if rank == 0 else None  # noqa: SIM115
    step = start
    while not finished(out):
        t0 = time.perf_counter()
        trainer.step(step)
        t1 = time.perf_counter()
        step += 1
        worker.step(step)  # progress, for elasticd (a restart with progress since is no repeat failure)
        if step % every == 0:
            worker.save_checkpoint(trainer.state(step), out / "ckpt.pt")
        t2 = time.perf_counter()
        if progress is not None:
            progress.write(f"{step - 1} {time.time():.4f} {attempt} {t1 - t0:.5f} {t2 - t1:.5f}\n")
    if progress is not None:
        progress.close()


def main() -> None:
    args = parse_args()
    out = args.out
    # A restart under torchrun --standalone sometimes hangs here (gloo's connect) on this machine:
    # with a timeout the attempt fails and torchrun starts another, instead of waiting 30 minutes.
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.init_timeout)
    )
    write_atomic(out / f"pid.{dist.get_rank()}", f"{os.getpid()} {start_ticks(os.getpid())}")
    trainer = Trainer(args.hidden, args.batch)
    if args.calibrate:
        calibrate(trainer, out, args.calibrate)
    else:
        state = worker.load_checkpoint(out / "ckpt.pt")
        if state is not None:
            trainer.load(state)
        train(trainer, out, args.every, worker.resume_step(state))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
