"""The environment marker every worker carries: which daemon (owner) and which job started it.

Its own module, without psutil, so that the pure code that builds a worker's environment
(``jobs.env``) does not load what finds and kills trees (``tree``).
"""

from __future__ import annotations

OWNER_ENV = "ELASTICD_OWNER"
JOB_ENV = "ELASTICD_JOB"
