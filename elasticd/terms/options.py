"""The job spec's terms that a client shares: what an entry point can be, what names a module,
and the round timeouts' defaults.

They live apart from ``elasticd.terms.spec`` (the spec's validation and decoding, which loads
``elasticd.decode`` and the daemon's logging) so that ``elasticd.wire`` and ``elasticctl`` import
them alone: every ``elasticctl submit`` pays for its imports before its request leaves.
"""

from __future__ import annotations

import re
from enum import StrEnum

MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,15}$")
DEFAULT_LAST_CALL_S = 2.0
DEFAULT_JOIN_TIMEOUT_S = 600.0
MAX_PRIORITY = 1000  # a job's admission priority: 0 (everyone's) .. MAX_PRIORITY (root and admins)


class EntryKind(StrEnum):
    SCRIPT = "script"  # python -u SCRIPT ARGS
    MODULE = "module"  # python -u -m MODULE ARGS
    EXEC = "exec"  # EXE ARGS (torchrun --no-python)


NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")  # torchrun's --numa-binding values


class StragglerPolicy(StrEnum):
    """What a job does about a rank the others wait for (``--stragglers``)."""

    REPORT = "report"  # name it (status, metrics, events) and nothing more
    DRAIN = "drain"  # also drain its node out of the job (the graceful drain) once named for the grace
