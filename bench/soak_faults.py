"""Fault injectors: one small class per kind, each knowing how to inject, how to undo, and when
the job has recovered.

Recovery is an observable event, never a sleep: the job's progress log (``soak_job.py``) shows a
step completed *after* the fault was undone, at full strength (one rank per node), in a round newer
than the one the fault hit when the fault must force a new round. Time to recover is from the
injection to that step's completion. ``resumed`` is the first step of a newer round at any world
size (the job going on without the node, before the node is back).

Partitions (``tests/netfaults.py``; the cluster runs in network namespaces) are healed once the
fault had its observable effect: a cut node's workers gone and the job going on without it.
For a fault that takes a node off etcd, ``fenced_s`` is from the cut to the death of the last of
the node's workers that were alive at the cut (polled every 20 ms); it must stay within the
lease TTL + 1 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar

import psutil
from soak_cluster import Cluster, Step, read_lives, wait_until
from soak_plan import Fault, FaultKind

from elasticd.workers.proctree import tree as proctree
from tests.netfaults import ETCD, Faults

SLOW_ETCD_S = 0.2


class Injector:
    kind: ClassVar[FaultKind]
    bumps_round: ClassVar[bool] = True  # the fault must force a new round (else: any progress counts)
    fences: ClassVar[bool] = False  # takes the node off etcd: its workers must be fenced in time
    watches: ClassVar[bool] = False  # fenced_s: when the target's workers died

    def inject(self, c: Cluster, target: int) -> str:
        """Do the damage; a short description of what was hit."""
        raise NotImplementedError

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        """Put things back (restart, SIGCONT, undrain) once the fault has had its effect; a note."""
        return ""


class WorkerKill(Injector):
    kind = FaultKind.WORKER_KILL

    def inject(self, c: Cluster, target: int) -> str:
        node = c.node_ids[target]
        pids = c.worker_pids(target)
        if not pids:  # status unavailable: the workers carry the job's marker in their environment
            marked = proctree.marked(node, c.job_id)
            pids = [p.pid for p in marked if p.ppid() not in {q.pid for q in marked}]
        if not pids:
            raise RuntimeError(f"no worker of the job on {node}")
        os.kill(pids[0], signal.SIGKILL)
        return f"kill -9 worker pid {pids[0]} on {node}"


class DaemonKill(Injector):
    kind = FaultKind.DAEMON_KILL
    down_s = 2.0

    def inject(self, c: Cluster, target: int) -> str:
        c.daemons[target].kill9()
        return f"kill -9 daemon {c.node_ids[target]}"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        time.sleep(self.down_s)  # the fault's duration, not a wait for an event
        c.daemons[target].start(wait=True)
        return f"restarted after {self.down_s:.0f}s"


class DaemonStop(Injector):
    kind = FaultKind.DAEMON_STOP

    def inject(self, c: Cluster, target: int) -> str:
        c.freeze(target)
        return f"SIGSTOP daemon {c.node_ids[target]}"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        held = 2 * c.ttl_s + 1  # well past the lease TTL: the node is fenced and its lease expires
        time.sleep(held)  # the fault's duration, not a wait for an event
        c.cont(target)
        return f"SIGCONT after {held:.0f}s"


class EtcdRestart(Injector):
    kind = FaultKind.ETCD_RESTART
    bumps_round = False  # a short outage may pass without a new round

    def inject(self, c: Cluster, target: int) -> str:
        c.etcd.kill()
        return "kill -9 etcd"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        down = c.ttl_s  # as long as a lease: fencing deadlines pass
        time.sleep(down)  # the fault's duration, not a wait for an event
        c.etcd.start()
        return f"restarted after {down:.0f}s"


class Drain(Injector):
    kind = FaultKind.DRAIN

    def inject(self, c: Cluster, target: int) -> str:
        rc, text = c.ctl("drain", c.node_ids[target], "--grace", "10", exclude=target)
        if rc != 0:
            raise RuntimeError(f"drain refused ({rc}): {text}")
        return f"drain {c.node_ids[target]}"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        # Undrain only once the job went on without the node, so the drain really happened.
        full = len(c.daemons)
        went_on = wait_until(
            lambda: any(s.round > base.round and s.world < full for s in c.progress.poll()[-20:]), timeout_s
        )
        rc, text = c.ctl("undrain", c.node_ids[target], exclude=None)
        if rc != 0:
            raise RuntimeError(f"undrain failed ({rc}): {text}")
        return "undrained" if went_on else "undrained (the job never ran without the node)"


class HungRank(Injector):
    kind = FaultKind.HUNG_RANK

    def inject(self, c: Cluster, target: int) -> str:
        rank = target % len(c.daemons)
        c.request_hang(rank)
        return f"rank {rank} hangs"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        # The rank removes its trigger when it starts hanging; one never picked up (the round
        # moved on first) must not hang a later round out of the plan.
        trigger = c.out / f"hang.{target % len(c.daemons)}"
        if wait_until(lambda: not trigger.exists(), timeout_s, 0.1):
            return ""
        trigger.unlink(missing_ok=True)
        return "the rank never picked the trigger up"


def _faults(c: Cluster) -> Faults:
    if c.faults is None:
        raise RuntimeError("partitions need the cluster in network namespaces (soak --netns)")
    return c.faults


def went_on_without(c: Cluster, base: Step) -> bool:
    """The job ran a step in a newer round at less than full strength (without the cut node)."""
    full = len(c.daemons)
    return any(s.at >= base.at and s.round > base.round and s.world < full for s in c.progress.poll())


class EtcdCut(Injector):
    kind = FaultKind.ETCD_CUT
    fences = True
    watches = True

    def inject(self, c: Cluster, target: int) -> str:
        _faults(c).cut(target, ETCD)
        return f"cut {c.node_ids[target]} from etcd"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        went_on = wait_until(lambda: went_on_without(c, base), timeout_s, 0.1)
        _faults(c).heal()
        return "healed" + ("" if went_on else " (the job never went on without the node)")


class OneWayLoss(EtcdCut):
    kind = FaultKind.ONE_WAY

    def inject(self, c: Cluster, target: int) -> str:
        others = [i for i in range(len(c.daemons)) if i != target]
        _faults(c).drop_from(target, [ETCD, *others])
        return f"drop all {c.node_ids[target]} sends"


class PeerCut(Injector):
    kind = FaultKind.PEER_CUT
    watches = True

    def inject(self, c: Cluster, target: int) -> str:
        f = _faults(c)
        for other in range(len(c.daemons)):
            if other != target:
                f.cut(target, other)
        return f"cut {c.node_ids[target]} from its peers"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        # Nothing but the job's hang timeout notices a silent peer link: heal once a newer round's
        # workers started (from their own life lines), so the fault really broke the round.
        def newer_round() -> bool:
            return any(life.what == "start" and life.round > base.round for life in read_lives(c.out))

        moved = wait_until(newer_round, timeout_s, 0.2)
        _faults(c).heal()
        return "healed" + ("" if moved else " (no newer round started while cut)")


class EtcdSlow(Injector):
    kind = FaultKind.ETCD_SLOW

    def inject(self, c: Cluster, target: int) -> str:
        if c.proxy is None:
            raise RuntimeError("a slow etcd needs the cluster's relay (soak --netns)")
        c.proxy.delay_s = SLOW_ETCD_S
        # A round under the slow etcd: without it the job would just go on.
        killed = WorkerKill().inject(c, target)
        return f"etcd requests +{SLOW_ETCD_S * 1000:.0f} ms, {killed}"

    def undo(self, c: Cluster, target: int, base: Step, timeout_s: float) -> str:
        full = len(c.daemons)
        done = wait_until(
            lambda: any(
                s.round > base.round and s.world == full and s.at >= base.at for s in c.progress.poll()
            ),
            timeout_s,
            0.2,
        )
        assert c.proxy is not None
        c.proxy.delay_s = 0.0
        return "recovered while slow, then sped up" if done else "sped up (no recovery while slow)"


INJECTORS: dict[FaultKind, Injector] = {
    i.kind: i
    for i in (
        WorkerKill(), DaemonKill(), DaemonStop(), EtcdRestart(), Drain(), HungRank(),
        EtcdCut(), OneWayLoss(), PeerCut(), EtcdSlow(),
    )
}  # fmt: skip


class DeathWatch:
    """When the last of ``procs`` died: a thread polls them every 20 ms (until ``stop``)."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs
        self.dead_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="death-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not any(_alive(p) for p in self.procs):
                self.dead_at = time.time()
                return
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class FaultResult:
    fault: Fault
    started_s: float = 0.0  # since the soak's clock started
    detail: str = ""
    note: str = ""
    survived: bool = False
    recover_s: float | None = None  # injection -> a step at full strength after the undo
    fenced_s: float | None = None  # injection -> the target's last worker (alive at the cut) died
    fence_bound_s: float | None = None  # what fenced_s must stay within (TTL + 1 s), for fencing faults
    resumed_s: float | None = None  # injection -> the first step of a newer round (any world)
    rounds: list[int] = field(default_factory=list)


def recovered_step(c: Cluster, base: Step, after: float, bumps_round: bool) -> Step | None:
    """The first step completed after ``after`` at full strength (in a newer round, if need be)."""
    full = len(c.daemons)
    for s in c.progress.poll():
        if s.at >= after and s.world == full and (s.round > base.round or not bumps_round):
            return s
    return None


def run_fault(c: Cluster, fault: Fault, clock0: float, timeout_s: float) -> FaultResult:
    """Inject, undo, and wait for recovery (at most ``timeout_s`` after the undo)."""
    result = FaultResult(fault)
    inj = INJECTORS[fault.kind]
    base = c.progress.last()
    assert base is not None
    watch = DeathWatch(c.live_workers(fault.target)) if inj.watches else None
    t0 = time.time()
    result.started_s = round(t0 - clock0, 1)
    try:
        result.detail = inj.inject(c, fault.target)
        result.note = inj.undo(c, fault.target, base, timeout_s)
    except Exception as e:  # an injector that could not do its part: the fault did not happen
        result.note = f"injector error: {e}"
        if fault.kind is FaultKind.DAEMON_STOP:
            with contextlib.suppress(Exception):
                c.cont(fault.target)
        if c.faults is not None:
            c.faults.heal()
        if c.proxy is not None:
            c.proxy.delay_s = 0.0
        return result
    finally:
        if watch is not None:
            watch.stop()
            if watch.procs and watch.dead_at is not None:
                result.fenced_s = round(watch.dead_at - t0, 2)
    if inj.fences:
        result.fence_bound_s = c.ttl_s + 1.0
    after = time.time()
    step = wait_until(lambda: recovered_step(c, base, after, inj.bumps_round), timeout_s, 0.2)
    newer = [s for s in c.progress.poll() if s.at >= t0 and s.round > base.round]
    if newer:
        result.resumed_s = round(newer[0].at - t0, 2)
    result.rounds = sorted({s.round for s in c.progress.steps if s.at >= t0})
    if step is not None:
        result.survived = True
        result.recover_s = round(step.at - t0, 2)
    else:
        view = c.status()
        result.note += f"; not recovered within {timeout_s:.0f}s (job: {view and view.get('state')})"
    return result
