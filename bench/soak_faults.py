"""Fault injectors: one small class per kind, each knowing how to inject, how to undo, and when
the job has recovered.

Recovery is an observable event, never a sleep: the job's progress log (``soak_job.py``) shows a
step completed *after* the fault was undone, at full strength (one rank per node), in a round newer
than the one the fault hit when the fault must force a new round. Time to recover is from the
injection to that step's completion. ``resumed`` is the first step of a newer round at any world
size (the job going on without the node, before the node is back).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import ClassVar

from soak_cluster import Cluster, Step, wait_until
from soak_plan import Fault, FaultKind

from elasticd.workers import proctree


class Injector:
    kind: ClassVar[FaultKind]
    bumps_round: ClassVar[bool] = True  # the fault must force a new round (else: any progress counts)

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


INJECTORS: dict[FaultKind, Injector] = {
    i.kind: i for i in (WorkerKill(), DaemonKill(), DaemonStop(), EtcdRestart(), Drain(), HungRank())
}


@dataclass
class FaultResult:
    fault: Fault
    started_s: float = 0.0  # since the soak's clock started
    detail: str = ""
    note: str = ""
    survived: bool = False
    recover_s: float | None = None  # injection -> a step at full strength after the undo
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
        return result
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
