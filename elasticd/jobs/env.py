"""The environment each worker gets: the torchrun contract, built purely from the attempt's facts.

A script written for ``torchrun`` that calls ``init_process_group(init_method="env://")`` runs
unchanged, because it sees exactly the variables torchrun's agent sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elasticd.workers.proctree.markers import JOB_ENV, OWNER_ENV

ROLE_NAME = "default"


@dataclass(frozen=True)
class WorldLayout:
    """Where this node's workers sit in the world of one round."""

    round: int
    group_rank: int  # this node's rank among the nodes of the round
    group_world_size: int  # nodes in the round
    rank_offset: int  # global rank of local rank 0 on this node
    world_size: int  # workers in the round
    local_world_size: int
    master_addr: str
    master_port: int


def worker_env(
    *,
    base: Mapping[str, str],
    layout: WorldLayout,
    local_rank: int,
    run_id: str,
    restart_count: int,
    max_restarts: int,
    visible_devices: str,
    error_file: str,
    owner: str,
    agent_store: bool = False,
) -> dict[str, str]:
    """``agent_store``: the ranks are clients of a store hosted for them on the master's node
    (``jobs.agentstore``), as torchrun's are of its agent's; else rank 0 hosts it."""
    env = zygote_env(base, run_id, owner)
    rank = layout.rank_offset + local_rank
    env |= {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(layout.group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": ROLE_NAME,
        "LOCAL_WORLD_SIZE": str(layout.local_world_size),
        "WORLD_SIZE": str(layout.world_size),
        "GROUP_WORLD_SIZE": str(layout.group_world_size),
        "ROLE_WORLD_SIZE": str(layout.world_size),
        "MASTER_ADDR": layout.master_addr,
        "MASTER_PORT": str(layout.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(agent_store),
        "TORCHELASTIC_ERROR_FILE": error_file,
        "CUDA_VISIBLE_DEVICES": visible_devices,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # so CUDA's indices are NVML's indices
        "ELASTICD_ROUND": str(layout.round),  # rendezvous round (log dirs are attempt_<round>)
    }
    return env


def zygote_env(base: Mapping[str, str], run_id: str, owner: str) -> dict[str, str]:
    """What every worker of the job on this node has in common, whatever its rank and attempt: the
    environment of the job's zygote (``elasticd.workers.warm.zygote``), which imports torch with what
    libraries read at load time (``OMP_NUM_THREADS``: OpenMP and OpenBLAS size their pools then).
    It carries the node's and job's markers, which its forked workers keep in their
    ``/proc/<pid>/environ`` (what ``proctree.marked`` reads) where the kernel refuses them their
    own (``workers.zygote_program.title``)."""
    env = dict(base)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", OWNER_ENV: owner, JOB_ENV: run_id}
    return env
