"""Fakes and builders for unit tests, kept in one place."""

from __future__ import annotations

from typing import Any

from elasticd.jobs.spec import EntryKind, JobSpec, NodeRange

JOB = "train-0a1b2c3d"


def make_spec(**overrides: Any) -> JobSpec:
    """A valid JobSpec; each test file states only what it cares about."""
    fields: dict[str, Any] = {
        "id": JOB,
        "name": "train",
        "entry_kind": EntryKind.SCRIPT,
        "entry": "/home/u/train.py",
        "args": ("--epochs", "2"),
        "python": "/usr/bin/python3",
        "cwd": "/home/u",
        "env": {},
        "uid": 1000,
        "gid": 1000,
        "user": "u",
        "nnodes": NodeRange(1, 2),
        "nproc_per_node": 2,
        "submitted_at": 1700000000.5,
    }
    return JobSpec(**(fields | overrides))
