"""elasticd.jobs.env.worker_env: the torchrun environment contract."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from elasticd.jobs.env import ROLE_NAME, WorldLayout, worker_env
from elasticd.workers.proctree.markers import JOB_ENV, OWNER_ENV

LAYOUT = WorldLayout(
    round=0,
    group_rank=1,
    group_world_size=3,
    rank_offset=4,
    world_size=12,
    local_world_size=4,
    master_addr="10.0.0.1",
    master_port=29500,
)


def env_for(
    local_rank: int = 2,
    base: Mapping[str, str] | None = None,
    layout: WorldLayout = LAYOUT,
    agent_store: bool = True,
) -> dict[str, str]:
    return worker_env(
        base=base if base is not None else {},
        layout=layout,
        local_rank=local_rank,
        run_id="train-1234abcd",
        restart_count=2,
        max_restarts=5,
        visible_devices="4,5,6,7",
        error_file="/logs/train/attempt_2/error_2.json",
        owner="node-a",
        agent_store=agent_store,
    )


def test_torchrun_variables() -> None:
    env = env_for(local_rank=2)
    expected = {
        "RANK": "6",  # rank_offset + local_rank
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "12",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "ROLE_RANK": "6",
        "ROLE_NAME": "default",
        "GROUP_WORLD_SIZE": "3",
        "ROLE_WORLD_SIZE": "12",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "TORCHELASTIC_RUN_ID": "train-1234abcd",
        "TORCHELASTIC_ERROR_FILE": "/logs/train/attempt_2/error_2.json",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        OWNER_ENV: "node-a",
        JOB_ENV: "train-1234abcd",
    }
    assert {k: env[k] for k in expected} == expected
    assert ROLE_NAME == "default"


def test_without_a_store_host_rank_0_hosts_the_store() -> None:
    assert env_for(agent_store=False)["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_every_value_is_a_string() -> None:
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env_for().items())


@pytest.mark.parametrize(("local_rank", "rank"), [(0, 4), (1, 5), (3, 7)])
def test_rank_offset_applied(local_rank: int, rank: int) -> None:
    env = env_for(local_rank=local_rank)
    assert env["RANK"] == env["ROLE_RANK"] == str(rank)
    assert env["LOCAL_RANK"] == str(local_rank)


def test_single_node_layout() -> None:
    layout = WorldLayout(0, 0, 1, 0, 2, 2, "127.0.0.1", 1234)
    env = env_for(local_rank=1, layout=layout)
    assert (env["RANK"], env["GROUP_RANK"], env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == (
        "1",
        "0",
        "2",
        "1",
    )


def test_base_env_is_kept_and_not_mutated() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/home/u", "MY_SETTING": "x"}
    env = env_for(base=base)
    assert {k: env[k] for k in base} == base
    assert base == {"PATH": "/usr/bin", "HOME": "/home/u", "MY_SETTING": "x"}


@pytest.mark.parametrize(
    "stale",
    [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
        "CUDA_VISIBLE_DEVICES",
        OWNER_ENV,
        JOB_ENV,
    ],
)
def test_stale_base_values_are_overridden(stale: str) -> None:
    fresh = env_for()[stale]
    assert env_for(base={stale: "stale-value-999"})[stale] == fresh


def test_omp_num_threads_defaults_to_one() -> None:
    assert env_for(base={})["OMP_NUM_THREADS"] == "1"


def test_omp_num_threads_from_base_is_kept() -> None:
    assert env_for(base={"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"


def test_nccl_async_error_handling_default_and_override() -> None:
    assert env_for()["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env_for(base={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_cpu_host_gets_empty_cuda_visible_devices() -> None:
    env = worker_env(
        base={"CUDA_VISIBLE_DEVICES": "0,1"},
        layout=LAYOUT,
        local_rank=0,
        run_id="r",
        restart_count=0,
        max_restarts=0,
        visible_devices="",
        error_file="/e",
        owner="o",
    )
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
