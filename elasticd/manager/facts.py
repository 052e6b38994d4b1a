"""What the command service knows of this daemon: its identity and the defaults its commands apply."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elasticd.jobs.quota import NO_QUOTAS, Quotas
from elasticd.manager.access import ROOT_ONLY, Admins


@dataclass(frozen=True)
class NodeFacts:
    """What the commands report about this daemon and the defaults they apply."""

    node_id: str
    started_at: float
    etcd_endpoints: tuple[str, ...]
    embedded_etcd: bool
    allow_root_jobs: bool
    stop_grace_s: float
    log_dir: Path
    quotas: Quotas = NO_QUOTAS  # per-user limits (``jobs.quota``)
    admins: Admins = ROOT_ONLY  # who gets the admin limits and may set --priority
    node_check: bool = False  # the default of a job's --node-check (setting node_check)
