"""CommandService.owner_of: the owner for permission checks, from one small read of the job."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from elasticd.errors import JobNotFound
from elasticd.etcd.keys import Keys
from elasticd.etcd.memory import MemoryKV
from elasticd.manager.facts import NodeFacts
from elasticd.manager.service import CommandService
from elasticd.rendezvous.store import InlineJobStore, run_inline
from tests.fakes import JOB, head_of, make_spec

KEYS = Keys("/x")


def owner(kv: MemoryKV, job: str) -> Any:
    facts = NodeFacts("n1", 0.0, (), True, False, 10.0, Path("/nonexistent"))
    service = CommandService(facts, None, None, kv, KEYS)  # type: ignore[arg-type]  # only the store is used
    return asyncio.run(service.owner_of(job))


def test_owner_of_a_job_its_absence_and_an_unreadable_spec() -> None:
    kv = MemoryKV()
    run_inline(InlineJobStore(kv, KEYS, JOB).create(make_spec()))
    assert owner(kv, JOB) == (1000, "u")
    for missing in ("no-such-job", "bad id"):
        with pytest.raises(JobNotFound):
            owner(kv, missing)
    kv.put_json(KEYS.job_spec(JOB), {"id": JOB, "uid": "root?"})
    assert owner(kv, JOB) is None  # only root may act on it (the janitor fails it)
    kv.delete(KEYS.job_spec(JOB))
    assert owner(kv, JOB) is None  # the job's other keys are still there
    kv.put_json(KEYS.job_spec(JOB), head_of(make_spec(id="other-1")).to_json())
    assert owner(kv, JOB) is None  # a spec naming another job owns nothing
