"""Each node drops its own logs of jobs whose records are gone (removed, or past retention).

Every node sweeps its own log directory at the end of a full scan (``JobManager.scan``): logs are
per node, so the janitor, which acts for the cluster, cannot.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path

from elasticd import log
from elasticd.jobs import logdir, logread

_log = log.get("elasticd.jobs")


def sweep_logs(log_dir: Path, known: set[str], running: Container[str]) -> list[str]:
    """Drop this node's logs of jobs whose records are gone (not ``known``), but of a job it still
    takes part in (``running``)."""
    gone = [j for j in logread.list_dir(log_dir, ()) if j not in known and j not in running]
    removed = []
    for job in gone:
        try:
            if logdir.remove_job(log_dir, job):
                removed.append(job)
        except OSError as exc:  # a full or read-only disk: the next sweep tries again
            _log.warning("logs.remove_failed", job=job, error=repr(exc))
    if removed:
        _log.info("logs.removed", jobs=removed)
    return removed
