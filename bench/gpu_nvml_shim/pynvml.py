"""The real pynvml, with one reading a file can raise: a GPU made unhealthy at the NVML layer.

``bench/gpu_check.sh`` puts this directory first on the daemon's ``PYTHONPATH``. Every call goes
to the real library (found on the rest of ``sys.path``) but ``nvmlDeviceGetTotalEccErrors``,
which adds, for uncorrectable errors, the count the JSON file ``$ELASTICD_NVML_SHIM`` gives the
GPU's UUID: ``{"ecc_uncorrected": {"GPU-...": 1}}``. With no file, it is the real library.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.machinery.PathFinder.find_spec(
    "pynvml", [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
)
if _SPEC is None or _SPEC.loader is None:
    raise ImportError("the real pynvml (nvidia-ml-py) is not installed")
_real = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})


def _added(handle: Any) -> int:
    path = os.environ.get("ELASTICD_NVML_SHIM")
    if not path:
        return 0
    try:
        with open(path) as f:
            table = json.load(f).get("ecc_uncorrected", {})
    except (OSError, ValueError, AttributeError):
        return 0
    uuid = _real.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    return int(table.get(uuid, 0))


def nvmlDeviceGetTotalEccErrors(handle: Any, error_type: int, counter_type: int) -> int:
    added = _added(handle) if error_type == _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0
    try:
        return int(_real.nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type)) + added
    except _real.NVMLError_NotSupported:
        if added:  # a board without ECC: the simulated errors are all there is
            return added
        raise
