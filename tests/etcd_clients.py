"""Which etcd client each test daemon talks through (``--etcd-client``): the suite's one policy.

``ELASTICD_TEST_ETCD_CLIENT`` = ``mixed`` (the default), ``gateway`` or ``grpc``. Mixed: the daemons
of one test alternate in the order they are made, the first (and so every single-node test) on
the gateway, the second on grpc, the third on the gateway... so that every multi-node test runs
both clients against one another (a round led by a daemon on one, with members on the other) at
no cost in CI time, where running each multi-node test once per client would double it. Without
the grpc extra, mixed falls back to the gateway for every daemon and says why (``reason``, shown
in the test report's header); asking for ``grpc`` without it is a usage error.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "ELASTICD_TEST_ETCD_CLIENT"
MODES = ("mixed", "gateway", "grpc")
NO_GRPC = "the grpc extra is not installed (pip install 'elasticd[grpc]')"


def grpc_installed() -> bool:
    """Whether ``etcd_client = grpc`` can load (without importing grpc into this process)."""
    return all(importlib.util.find_spec(name) is not None for name in ("etcd3", "grpc"))


@dataclass(frozen=True)
class ClientPolicy:
    """The client of the ``index``-th daemon a test makes (from 0, in the order it makes them)."""

    asked: str  # what ELASTICD_TEST_ETCD_CLIENT says
    mode: str  # what runs: the asked mode, or gateway when mixed cannot have grpc
    reason: str = ""  # why mode differs from asked ("" when it does not)

    def client(self, index: int) -> str:
        if self.mode == "mixed":
            return "grpc" if index % 2 else "gateway"
        return self.mode

    def header(self) -> str:
        """One line for the test report: what the daemons run on, and why when not as asked."""
        if self.mode == "mixed":
            what = "mixed (the daemons of a test alternate: 1st gateway, 2nd grpc, ...)"
        else:
            what = f"{self.mode} for every daemon"
        why = f" instead of {self.asked}: {self.reason}" if self.reason else ""
        return f"etcd clients ({ENV}={self.asked}): {what}{why}"


def policy(env: Mapping[str, str] | None = None, has_grpc: bool | None = None) -> ClientPolicy:
    """The policy ``env`` asks for (``os.environ`` by default). Raises ``ValueError`` for a mode
    that is not one of ``MODES``, or for ``grpc`` where the grpc extra is not installed."""
    asked = (os.environ if env is None else env).get(ENV, "").strip() or "mixed"
    if asked not in MODES:
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, not {asked!r}")
    grpc_ok = grpc_installed() if has_grpc is None else has_grpc
    if grpc_ok or asked == "gateway":
        return ClientPolicy(asked, asked)
    if asked == "grpc":
        raise ValueError(f"{ENV}=grpc, but {NO_GRPC}")
    return ClientPolicy(asked, "gateway", NO_GRPC)
