"""Test-only stand-ins for this host's GPUs: never a setting of the daemon.

The integration tests run real daemons on hosts with no GPU, so they give a daemon a pretend
inventory through its environment, which only whoever starts the daemon sets (root, on a real
host): ``ELASTICD_TEST_FAKE_GPUS=N`` (N plain GPUs, with no NVML and so no health watcher) or
``ELASTICD_TEST_FAKE_NVML=FILE`` (a fake NVML driven by a JSON file the test rewrites as it goes:
``gpu/fakefile.py``; the file must be safe for root, ``trustedpath.trusted_file``). Neither is a
setting: no config key, flag or settings variable names them (``config.OPTIONS`` does not, so
``load_settings`` ignores these two), ``elasticd --help`` does not list them, and the daemon reads
them here only, once, when it starts (``compose.start``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from elasticd.errors import ConfigError

FAKE_GPUS_ENV = "ELASTICD_TEST_FAKE_GPUS"
FAKE_NVML_ENV = "ELASTICD_TEST_FAKE_NVML"


@dataclass(frozen=True)
class FakeHardware:
    """What a test pretends this host has; all None on every real host."""

    gpus: int | None = None  # N plain GPUs instead of asking NVML
    nvml: Path | None = None  # the JSON file a fake NVML reads, instead of the real library


def fake_hardware(environ: Mapping[str, str]) -> FakeHardware:
    """The test's stand-ins in ``environ``; ``ConfigError`` for a value that is not one."""
    gpus_text, nvml_text = environ.get(FAKE_GPUS_ENV, ""), environ.get(FAKE_NVML_ENV, "")
    gpus: int | None = None
    if gpus_text:
        try:
            gpus = int(gpus_text)
        except ValueError:
            raise ConfigError(f"{FAKE_GPUS_ENV} must be a number of GPUs, not {gpus_text!r}") from None
        if gpus < 0:
            raise ConfigError(f"{FAKE_GPUS_ENV} must be >= 0")
    return FakeHardware(gpus, Path(nvml_text) if nvml_text else None)
