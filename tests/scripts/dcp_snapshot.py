"""torch.distributed.checkpoint through the snapshot keeper: ``MODE=save`` saves a tensor sharded
over the ranks (DTensor, Shard(0)) and a step ($STEP, default 3; the tensor is arange + STEP - 3);
``MODE=load`` loads it at this world size and
writes $OUT/loaded.<world>.json on rank 0 (the full tensor and the step). $PERSIST: the
writer's persist_every (default 1); $DIE: the ranks end with os._exit after the save, as a killed
worker would (no exit handler, no write behind)."""

import gc
import json
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from elasticd import worker


def main(out: str, mode: str) -> None:
    """The mesh and the DTensors live here, not in module globals: torch's DeviceMesh holds its
    process groups, and a group destroyed at interpreter finalisation (after
    ``destroy_process_group``) can abort the process ("terminate called without an active
    exception") when gloo's threads still reach into Python. Here they are gone before it."""
    ckpt = os.path.join(out, "dcp")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    state: dict[str, Any]
    if mode == "save":
        step = int(os.environ.get("STEP", "3"))
        full = torch.arange(24.0).reshape(12, 2) + step - 3
        state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "step": step}
        every = int(os.environ.get("PERSIST", "1"))
        save(state, storage_writer=worker.snapshot_writer(ckpt, step=step, persist_every=every))
        if os.environ.get("DIE"):
            os._exit(3)
        return
    state = {"w": distribute_tensor(torch.zeros(12, 2), mesh, [Shard(0)]), "step": 0}
    load(state, storage_reader=worker.snapshot_reader(ckpt))
    full = state["w"].full_tensor()
    if dist.get_rank() == 0:
        with open(os.path.join(out, f"loaded.{world}.json"), "w") as f:
            json.dump({"w": full.flatten().tolist(), "step": state["step"]}, f)


dist.init_process_group("gloo", init_method="env://")
main(os.environ["OUT"], os.environ["MODE"])
gc.collect()  # a cycle through the mesh would keep its groups past the destroy
dist.destroy_process_group()
