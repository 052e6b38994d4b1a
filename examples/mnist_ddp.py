"""An MNIST-shaped DDP classifier on synthetic data: nothing to download, the same result every run.

    torchrun --standalone --nproc-per-node 2 examples/mnist_ddp.py --epochs 3
    elasticrun --standalone --nproc-per-node 2 examples/mnist_ddp.py --epochs 3

The images are 1x28x28 and there are 10 classes, as in MNIST: each class has a fixed random
"glyph" and every sample is its class's glyph, shifted by up to a pixel, plus noise. A small
conv net learns them in a few epochs. Training data are split across ranks by a
DistributedSampler, the test set too, and the ranks' correct counts are summed, so the accuracy
printed is over the whole test set whatever the world size. With a fixed seed, the accuracy and
the weights' digest are identical from run to run and under either launcher.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CLASSES, SIDE = 10, 28


def synthetic_digits(samples: int, seed: int, glyph_seed: int = 1234) -> TensorDataset:
    """Noisy, shifted copies of one random glyph per class; labels balanced. The glyphs depend on
    ``glyph_seed`` only, so a training set and a test set (other ``seed``) share them."""
    glyphs = torch.rand(CLASSES, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(glyph_seed)) > 0.7
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(samples) % CLASSES
    images = glyphs[labels].float()
    shifts = torch.randint(-1, 2, (samples, 2), generator=gen)
    for i in range(samples):
        images[i] = torch.roll(images[i], shifts=(int(shifts[i, 0]), int(shifts[i, 1])), dims=(1, 2))
    images += 0.3 * torch.randn(images.shape, generator=gen)
    return TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),  # 8x13x13
            nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),  # 16x5x5
        )  # fmt: skip
        self.classify = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 64), nn.ReLU(), nn.Linear(64, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classify(self.features(x))
        return logits


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def evaluate(model: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]]) -> float:
    """Accuracy over the whole test set: every rank counts its shard, then the counts are summed."""
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-samples", type=int, default=2000)
    p.add_argument("--test-samples", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=50, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--result", type=Path, help="rank 0 writes the accuracy and digest here")
    args = p.parse_args()

    dist.init_process_group("gloo")  # the launcher's env: MASTER_ADDR/PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    train = synthetic_digits(args.train_samples, seed=args.seed)
    test = synthetic_digits(args.test_samples, seed=args.seed + 1000)
    sampler: DistributedSampler[int] = DistributedSampler(
        train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(
        test, batch_size=200, sampler=DistributedSampler(test, num_replicas=world, rank=rank, shuffle=False)
    )
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    accuracy = 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        accuracy = evaluate(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch} test accuracy {accuracy:.4f} (world {world})", flush=True)

    if rank == 0:
        final = digest(model.module)
        print(f"final accuracy {accuracy:.4f} digest {final}", flush=True)
        if args.result is not None:
            args.result.write_text(json.dumps({"accuracy": accuracy, "digest": final, "world": world}))
    dist.barrier()  # every rank is past its last collective before any tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
