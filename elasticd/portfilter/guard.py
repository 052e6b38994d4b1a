"""``PortFilter``: the daemon's one owner of elasticd's nftables table. The jobs this node runs
tell it who they are and who their members are (``admit``, at admission and at each round's
start) and when they leave (``release``); every change rebuilds the whole table in one
transaction (``rules.commands``), so the table never holds a rule of a job the daemon does not
own: not after a job, not after a crash (``start`` removes whatever a previous daemon left)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from elasticd import log
from elasticd.portfilter.libnft import NftLib
from elasticd.portfilter.nft import Nft, NftCli, NftError
from elasticd.portfilter.rules import Guard, Mode, Ruleset, commands, desired, rule_count

_log = log.get("elasticd.portfilter")


class PortFilter:
    """Methods run on the event loop's thread; ``nft`` runs in a worker thread, one batch at a time."""

    def __init__(self, nft: Nft | None, mode: Mode, why: str = "") -> None:
        self._nft = nft
        self.mode = mode if nft is not None else Mode.OFF
        self.why = why if nft is not None or why else "no packet filter"
        self._guards: dict[str, Guard] = {}
        self._applied: Ruleset | None = None
        self._lock = asyncio.Lock()
        self.failures = 0  # batches refused since the start (each logged)

    @classmethod
    def disabled(cls, why: str = "off") -> PortFilter:
        return cls(None, Mode.OFF, why)

    @property
    def detail(self) -> str:
        """On: the identity it filters by; off: why (the node record's ``port_filter_detail``)."""
        return "uid" if self.mode is Mode.ON else self.why[:120]

    @property
    def status(self) -> str:
        """As ``elasticctl nodes`` shows it: ``on (uid)``, or ``off: <why>``."""
        return f"on ({self.detail})" if self.mode is Mode.ON else f"off: {self.detail}"

    @property
    def rules(self) -> int:
        return rule_count(commands(self._applied)) if self._applied is not None else 0

    async def start(self) -> None:
        """Remove what a previous daemon left (its jobs died with it); the filter goes off, saying
        why, if nft refuses (no privileges, no nf_tables in the kernel)."""
        if self.mode is not Mode.ON:
            _log.warning("portfilter.off", why=self.why, consequence="jobs' ports are open as under torchrun")
            return
        try:
            await self._run(Ruleset(()))
        except NftError as exc:
            self.mode, self.why = Mode.OFF, f"nft refused: {exc}"
            _log.warning("portfilter.off", why=self.why, consequence="jobs' ports are open as under torchrun")
            return
        _log.info("portfilter.on", table="inet elasticd", identity="uid")

    async def admit(self, guard: Guard) -> None:
        """``guard.job`` runs here as ``guard.uid`` with these members: the table says so when this
        returns (or the failure is logged: the job runs on, as it would with the filter off)."""
        self._guards[guard.job] = guard
        await self._sync(guard.job)

    async def listen(self, guard: Guard) -> None:
        """Add ``guard``'s listeners to its job's, keeping the members its last round named (none
        before its first): a store host started at a join, before the round is known."""
        held = self._guards.get(guard.job)
        if held is not None:
            guard = replace(held, listeners=held.listeners | guard.listeners)
        await self.admit(guard)

    async def release(self, job: str) -> None:
        if self._guards.pop(job, None) is not None:
            await self._sync(job)

    async def close(self) -> None:
        """The daemon stops: no rule stays behind it."""
        self._guards.clear()
        await self._sync("")

    async def _sync(self, job: str) -> None:
        if self.mode is not Mode.ON:
            return
        async with self._lock:
            want = desired(self._guards)
            if want == self._applied:
                return
            try:
                await self._run(want)
            except NftError as exc:
                self.failures += 1
                self._applied = None
                _log.error("portfilter.apply_failed", job=job, error=str(exc), users=len(want.users))

    async def _run(self, want: Ruleset) -> None:
        assert self._nft is not None  # mode ON implies one
        await asyncio.to_thread(self._nft.apply, commands(want))
        self._applied = want
        _log.debug("portfilter.applied", users=len(want.users), rules=rule_count(commands(want)))


def detect(enabled: bool) -> PortFilter:
    """The node's filter: off when the setting says so or neither libnftables nor ``nft`` is
    installed; ``start`` then finds whether the kernel and our privileges allow it. The library
    first: in-process, a change costs no process start before a round's workers start."""
    if not enabled:
        return PortFilter.disabled("port_filter is off")
    nft: Nft | None = NftLib.find() or NftCli.find()
    if nft is None:
        return PortFilter.disabled("no libnftables or nft binary (install the nftables package)")
    return PortFilter(nft, Mode.ON)
