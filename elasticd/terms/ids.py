"""The names every layer checks before it uses one: node ids, job ids, round numbers.

Nothing from ``elasticd`` is imported here: the etcd key layout, the node registry and the
event filters check ids with the same rules as the job spec, without loading the spec.
"""

from __future__ import annotations

import re
import secrets

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
NODE_ID = NAME  # the same rule as elasticd.node.statedir applies to --node-id
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MAX_ROUND = 2**31 - 1


GPU_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9_.-]{1,90}$")  # NVML's, and the fake's


def valid_gpu_uuid(text: str) -> bool:
    return bool(GPU_UUID.match(text))


def valid_node_id(text: str) -> bool:
    return bool(NODE_ID.match(text))


def valid_job_id(text: str) -> bool:
    return bool(JOB_ID.match(text))


def new_job_id(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"
