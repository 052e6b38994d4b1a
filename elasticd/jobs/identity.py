"""Whose identity a job's processes take on this node: the submitter's, never the daemon's.

Only a root daemon can switch users (and must); a daemon running as a user runs that user's jobs
as itself. Supplementary groups come from the user database, as a login would give them.
"""

from __future__ import annotations

import os
import pwd

from elasticd.terms.spec import JobSpec
from elasticd.workers.proctree.spawn import Identity


def switch_to(spec: JobSpec) -> Identity | None:
    """The identity to switch to before running anything of ``spec``; None: stay as we are."""
    if os.geteuid() != 0 or spec.uid == 0:
        return None
    try:
        groups = tuple(os.getgrouplist(pwd.getpwuid(spec.uid).pw_name, spec.gid))
    except KeyError:  # a uid without a passwd entry (containers): its primary group only
        groups = (spec.gid,)
    return Identity(spec.uid, spec.gid, groups)
