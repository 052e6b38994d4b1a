"""A size's record (``Outcome``, the JSON's ``outcomes``) and the tables printed from them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Outcome:
    side: str
    n: int
    finished: int
    seconds: float | None  # start signal -> every participant holds the result
    requests_per_participant: float  # median
    note: str = ""
    procs: int = 1
    requests_max: float = 0.0  # over the participants that did not lead
    leader_requests: float = 0.0  # the leader reads the joins again per batch of joins it is woken for
    last_join: float | None = None  # start signal -> the last join put returned
    after_last_join: float | None = None  # the last join -> every participant holds the result
    closed: float | None = None  # the last join -> the leader sends its close
    events: int = 0  # watch events the participants received (the leader's join watch included)
    join_events: int = 0  # ... of which joins
    # Where the time after the close goes: the leader's close -> each participant's watch
    # delivered the result, and that -> it had read the job (median, max); CPU seconds of etcd
    # and of the participants' processes (the harness) over the whole run.
    result_event: tuple[float, float] | None = None
    result_read: tuple[float, float] | None = None
    result_read_cpu: tuple[float, float] | None = None  # that last step's CPU time, in its thread
    etcd_cpu_s: float = 0.0
    # etcd's CPU from the start signal to the end: the round itself, without each node's lease
    # and watch streams (a daemon opens those once in its life, not once per round)
    etcd_round_cpu_s: float = 0.0
    harness_cpu_s: float = 0.0
    # Bytes each participant read (unary response bodies and watch lines, as received) and wrote
    # (request bodies): median and max over those that did not lead; the leader's apart.
    read_bytes_per_participant: tuple[float, float] = (0.0, 0.0)
    written_bytes_per_participant: tuple[float, float] = (0.0, 0.0)
    leader_read_bytes: int = 0
    leader_written_bytes: int = 0
    watch_bytes_per_participant: tuple[float, float] = (0.0, 0.0)  # of the bytes read, from watches
    # A daemon's copy of every job (``ClusterCopy``) that held the job before the round: what
    # it read and what its watch brought until it held the round's head, and what ``rounds/``
    # (every member's assignment, which the copy leaves to the few that need it) would add to it
    # (``ScanProbe``).
    scan_read_bytes: int = 0
    scan_watch_bytes: int = 0
    scan_rounds_bytes: int = 0
    load: str = ""  # ``uptime``'s load averages before the run: the machine is shared


def median_max(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values)


def _s(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "-"


def report(outcomes: list[Outcome]) -> None:
    print()
    print(
        f"{'N':>6}  {'side':<11} {'procs':>5} {'last join (s)':>13} {'closed after last join (s)':>27}"
        f" {'(leader)':>8} {'total (s)':>10} {'req/participant med':>20} {'max':>5} {'leader':>6}"
        f" {'events':>8} {'join ev.':>8}  note"
    )
    for o in outcomes:
        total = _s(o.seconds) if o.seconds is not None else f"DNF ({o.finished}/{o.n})"
        print(
            f"{o.n:>6}  {o.side:<11} {o.procs:>5} {_s(o.last_join):>13} {_s(o.after_last_join):>27}"
            f" {_s(o.closed):>8} {total:>10} {o.requests_per_participant:>20.1f} {o.requests_max:>5.0f}"
            f" {o.leader_requests:>6.0f} {o.events:>8} {o.join_events:>8}  {o.note}"
        )
    for o in outcomes:
        if o.side.startswith("elasticd"):
            rb, wb, lb = (
                o.read_bytes_per_participant,
                o.written_bytes_per_participant,
                o.watch_bytes_per_participant,
            )
            print(
                f"{o.n:>6}  bytes per participant read {rb[0]:.0f}/{rb[1]:.0f}"
                f" (of which watch {lb[0]:.0f}/{lb[1]:.0f}),"
                f" written {wb[0]:.0f}/{wb[1]:.0f} (median/max); the leader read {o.leader_read_bytes}"
                f" and wrote {o.leader_written_bytes}; load before: {o.load}"
            )
            print(
                f"{o.n:>6}  a daemon's copy of every job read {o.scan_read_bytes} bytes for the round"
                f" and its watch brought {o.scan_watch_bytes} (every change it watches, the round's"
                f" head among them); rounds/ would add {o.scan_rounds_bytes}"
            )
    for o in outcomes:
        if o.result_event is not None and o.result_read is not None and o.result_read_cpu is not None:
            print(
                f"{o.n:>6}  after the close: result event {o.result_event[0]:.3f}/{o.result_event[1]:.3f} s,"
                f" then read {o.result_read[0]:.3f}/{o.result_read[1]:.3f} s (median/max; CPU"
                f" {o.result_read_cpu[0] * 1000:.0f}/{o.result_read_cpu[1] * 1000:.0f} ms);"
                f" CPU of the run: etcd {o.etcd_cpu_s:.1f} s (the round alone {o.etcd_round_cpu_s:.1f} s,"
                f" {1000 * o.etcd_round_cpu_s / o.n:.2f} ms a participant),"
                f" participants {o.harness_cpu_s:.1f} s"
            )
    versus(outcomes)
    mine = [o for o in outcomes if o.side == "elasticd" and o.seconds is not None]
    if len(mine) > 1:
        flat = max(o.requests_max for o in mine) <= min(o.requests_max for o in mine) + 2
        print(f"O(1) requests per participant (not leading): {'yes' if flat else 'NO'} (max per N: "
              + ", ".join(f"{o.n}: {o.requests_max:.0f}" for o in mine) + ")")  # fmt: skip


def versus(outcomes: list[Outcome]) -> None:
    """Each side's medians per N (``--versus``: rounds of two commits' participants, interleaved):
    after the last join until all hold their assignment, and etcd's CPU per participant over the
    round; each side against the first."""
    sides = list(dict.fromkeys(o.side for o in outcomes if o.side.startswith("elasticd")))
    if len(sides) < 2:
        return
    print(
        f"\n{'N':>6}  {'side':<24} {'rounds':>6} {'all hold after last join (s)':>29}"
        f" {'etcd CPU/participant (ms)':>26}"
    )
    for n in sorted({o.n for o in outcomes}):
        base: tuple[float, float] | None = None
        for side in sides:
            done = [o for o in outcomes if o.side == side and o.n == n and o.after_last_join is not None]
            if not done:
                continue
            wall = statistics.median(o.after_last_join or 0.0 for o in done)
            cpu = statistics.median(1000 * o.etcd_round_cpu_s / n for o in done)
            base = base or (wall, cpu)
            ratio = f"  ({_ratio(wall, base[0])}, {_ratio(cpu, base[1])})" if (wall, cpu) != base else ""
            print(f"{n:>6}  {side:<24} {len(done):>6} {wall:>29.3f} {cpu:>26.2f}{ratio}")


def _ratio(figure: float, base: float) -> str:
    """``figure`` against ``base``; a base too small to measure (etcd's CPU over a tiny round reads
    0.0 at the clock's resolution) gives no ratio."""
    return f"{figure / base:.2f}x" if base > 0 else "-"
