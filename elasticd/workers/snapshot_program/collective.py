"""This process's place among a job's ranks (``group``, ``rank``: the one helper every worker-side
module asks), and plain data between the ranks, gathered as tensors of bytes.

``torch.distributed``'s ``*_object`` collectives (``all_gather_object``, ``broadcast_object_list``,
``gather_object``, ...) read the bytes they received back through numpy (``Tensor.numpy()``):
where torch runs without numpy, as its CPU wheel can, they fail with "Numpy is not available".
The workers' side of elasticd exchanges what it must here instead, with tensor collectives only:
each rank's length (one int64 each, gathered first), then its bytes as uint8, padded to the
longest and trimmed back. Every rank of the default group must make the same call.
"""

from __future__ import annotations

import json
import os
from typing import Any

RANK_ENV = "RANK"  # the launcher's (torchrun's, elasticd's) rank of this process


def group() -> Any:
    """``torch.distributed`` when its default group is up, else None (one process alone)."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank(fallback: int | None = None) -> int:
    """This process's rank in the default group. Without one: ``fallback`` where the caller's
    work is a single process's then (a checkpoint plugin, a DCP plan: rank 0), else the
    launcher's ``RANK`` (a script that checkpoints before, or without, ``init_process_group``)."""
    dist = group()
    if dist is not None:
        return int(dist.get_rank())
    return fallback if fallback is not None else int(os.environ.get(RANK_ENV, "0"))


def device(dist: Any) -> Any:
    """Where the default group's tensors must live: the current CUDA device under NCCL, else the CPU."""
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_bytes(data: bytes, dist: Any) -> list[bytes]:
    """Every rank's ``data``, in rank order (``dist`` None: this process alone)."""
    if dist is None:
        return [data]
    import torch

    where, world = device(dist), dist.get_world_size()
    length = torch.tensor([len(data)], dtype=torch.int64, device=where)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    sizes = [int(n.item()) for n in lengths]
    mine = torch.zeros(max(1, *sizes), dtype=torch.uint8, device=where)  # gloo wants no empty tensor
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    return [_bytes_of(t[:size]) for t, size in zip(everyone, sizes, strict=True)]


def _bytes_of(tensor: Any) -> bytes:
    """A uint8 tensor's bytes, copied out without numpy (``Tensor.numpy`` needs it)."""
    import torch

    out = bytearray(tensor.numel())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(tensor)
    return bytes(out)


def all_gather_json(value: Any, dist: Any) -> list[Any]:
    """Every rank's ``value`` (anything ``json`` writes), in rank order; None for one that does
    not read back as JSON."""
    gathered = all_gather_bytes(json.dumps(value).encode(), dist)
    return [_json_or_none(data) for data in gathered]


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:  # UnicodeDecodeError is one
        return None
