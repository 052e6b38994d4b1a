"""The calls between this node's lease (``NodeRegistry``) and the jobs it takes part in (``JobManager``).

The two need each other: the registry publishes the manager's free capacity and tells it when the
lease is lost (fence every multi-node worker) or granted anew (rescan); the manager reads the
lease. ``LeaseHooks`` is built first and passed to both constructors; the manager attaches itself
as it is built, so neither is patched once the other exists. Until then the registry has nobody to
tell and no capacity to add (it publishes nothing before the manager exists).
"""

from __future__ import annotations

from typing import Any, Protocol


class LeaseListener(Protocol):
    def capacity(self) -> dict[str, Any]: ...

    def fence_all(self) -> None: ...

    def wake(self) -> None: ...


class LeaseHooks:
    def __init__(self) -> None:
        self._listener: LeaseListener | None = None

    def attach(self, listener: LeaseListener) -> None:
        """Called once, by the listener's constructor."""
        if self._listener is not None:
            raise RuntimeError("lease hooks already have a listener")
        self._listener = listener

    def capacity(self) -> dict[str, Any]:
        return {} if self._listener is None else self._listener.capacity()

    def lost(self) -> None:
        if self._listener is not None:
            self._listener.fence_all()

    def granted(self) -> None:
        if self._listener is not None:
            self._listener.wake()
