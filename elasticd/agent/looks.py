"""What a round's admission needs measured (``Probe``, ``CheckNodes``), and what was found: the
inputs ``step`` reads as ``Local.reach`` and ``Local.checked`` (``rendezvous.reach``,
``rendezvous.fitness``). The executor's one place for these measurements."""

from __future__ import annotations

from elasticd import log
from elasticd.agent import actions as act
from elasticd.agent.seams import Clock, Launcher, Prober
from elasticd.node import liveness
from elasticd.rendezvous.fitness import Checked
from elasticd.rendezvous.reach import PROBE_TIMEOUT_S, Reach, Target

_log = log.get("elasticd.agent")


class Looks:
    """The last liveness probe of peers and the last node check of joiners' links, for one job."""

    def __init__(self, job: str, launcher: Launcher, clock: Clock, probe: Prober = liveness.probe) -> None:
        self._job = job
        self._launcher = launcher
        self._clock = clock
        self._probe_peers = probe
        self.reach: Reach | None = None
        self.checked: Checked | None = None

    async def look(self, action: act.Probe | act.CheckNodes) -> None:
        match action:
            case act.Probe(round_no, targets):
                await self._probe(round_no, targets)
            case act.CheckNodes(round_no, targets):
                links = await self._launcher.check_links(targets)
                self.checked = Checked(round_no, links, self._clock.time())
                bad = sorted(n for n, lk in links.items() if lk.error)
                _log.info("check.links", job=self._job, round=round_no, measured=len(links), failed=bad)

    async def _probe(self, round_no: int, targets: tuple[Target, ...]) -> None:
        reached, unreached = await self._probe_peers(targets, PROBE_TIMEOUT_S)
        before = self.reach.unreached if self.reach is not None else frozenset()
        self.reach = Reach(round_no, reached, unreached, self._clock.time())
        if unreached != before:  # once per change: a cut node probes every few seconds
            say = _log.warning if unreached else _log.info
            say("peer.reach", job=self._job, round=round_no, unreached=sorted(unreached))
