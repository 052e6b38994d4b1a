"""bench_single's output: one line per trial, the summary table, the samples, the daemon's
unexpected warnings, and the JSON file."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.daemonlog import cause, print_groups, print_not_json
from harness.runinfo import Run

from single.daemon import BenchDaemon
from single.trial import MAX_RESTARTS, NPROC, Trial


def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def fmt_secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}s"


def fmt_trial(tr: Trial) -> str:
    tag = "warm-up" if tr.index == 0 else f"#{tr.index}"
    status = "ok" if tr.ok else ("TIMEOUT" if tr.timed_out else "FAILED")
    parts = [f"{tr.scenario:<7} {tag:>7} {tr.launcher:<8} {status:<7}"]
    if tr.scenario == "start":
        parts.append(f"start={fmt_secs(tr.value_s)}")
    else:
        parts.append(
            f"a1={fmt_secs(tr.value_s)} recovery={fmt_secs(tr.recovery_s)}"
            f"(attempt {tr.recovered_attempt if tr.recovered_attempt is not None else '-'})"
        )
        parts.append(f"restarts={tr.restarts if tr.restarts is not None else '?'}")
    parts.append(f"attempts={tr.attempts_seen} wall={fmt_secs(tr.wall_s)}")
    if tr.state:
        parts.append(f"state={tr.state}")
    if tr.zygote:
        parts.append(f"zygote={tr.zygote}")
    if tr.leftovers_killed:
        parts.append(f"leftovers_killed={len(tr.leftovers_killed)}")
    if tr.error:
        parts.append(f"({tr.error})")
    return " ".join(parts)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    rows = []
    for scenario, metric in (("start", "value_s"), ("restart", "value_s"), ("restart", "recovery_s")):
        mine = [t for t in trials if t.scenario == scenario and t.index > 0]
        if not mine:
            continue
        name = (
            "start" if scenario == "start" else "restart(a1)" if metric == "value_s" else "restart(recovery)"
        )
        row: dict[str, Any] = {"scenario": name}
        for launcher in ("elasticd", "torchrun"):
            ts = [t for t in mine if t.launcher == launcher]
            samples = [getattr(t, metric) for t in ts if getattr(t, metric) is not None]
            row[launcher] = {
                "median_s": median(samples),
                "min_s": min(samples, default=None),
                "max_s": max(samples, default=None),
                "n": len(samples),
                "trials": len(ts),
                "failed": sum(not t.ok for t in ts),
                "timed_out": sum(t.timed_out for t in ts),
                "flaky": sum(t.flaky for t in ts) if scenario == "restart" else None,
                "samples_s": [getattr(t, metric) for t in ts],
                "zygotes": {z: sum(t.zygote == z for t in ts) for z in ("adopted", "started", "none")}
                if launcher == "elasticd"
                else None,
            }
        e, r = row["elasticd"]["median_s"], row["torchrun"]["median_s"]
        row["ratio"] = e / r if e is not None and r else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'scenario':<18} {'elasticd med(s)':>15} {'torchrun med(s)':>15} {'ratio e/t':>9}  "
        f"{'elasticd n/fail/flaky':>24}  {'torchrun n/fail/flaky':>24}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:

        def counts(s: dict[str, Any]) -> str:
            flaky = "-" if s["flaky"] is None else str(s["flaky"])
            return f"{s['n']}/{s['trials']} fail={s['failed']} flaky={flaky}"

        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(
            f"{row['scenario']:<18} {fmt_s(row['elasticd']['median_s']):>15} "
            f"{fmt_s(row['torchrun']['median_s']):>15} {ratio:>9}  "
            f"{counts(row['elasticd']):>24}  {counts(row['torchrun']):>24}"
        )
    print(
        "  n = trials with a sample / trials run; fail = launcher did not report success "
        "(incl. timeouts); flaky = failed or needed >1 restart"
    )
    for row in rows:
        z = row["elasticd"]["zygotes"]
        print(
            f"  {row['scenario']}: elasticd zygotes adopted from the pool {z['adopted']}, "
            f"started {z['started']}, none {z['none']}"
        )


def print_samples(rows: list[dict[str, Any]]) -> None:
    print("\nsamples (s, in trial order; '-' = no sample):")
    for row in rows:
        for launcher in ("elasticd", "torchrun"):
            vals = " ".join(fmt_s(v) for v in row[launcher]["samples_s"])
            print(f"  {row['scenario']:<18} {launcher:<8} {vals}")


def _injected_crash(line: str) -> bool:
    """The daemon's warning about the crash we inject (rank 1 of attempt 0 exits 1)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    summary = str(rec.get("summary", ""))
    return (
        rec.get("event") == "worker.failed"
        and rec.get("attempt", rec.get("round", 0)) == 0
        and summary.startswith("rank 1 ")
        and "exit code 1" in summary
    )


def report_daemon_problems(bench: BenchDaemon) -> list[str]:
    """Print the daemon's warnings and errors (but the injected crash's), grouped, and its stderr
    lines that are not log records; all of its warnings and errors, for the JSON output."""
    problems = bench.daemon_lines(levels=("warning", "error", "critical"))
    # (after a hung shutdown, what followed SIGTERM was printed already)
    printed = set(bench.daemon_lines(since=bench.stop_offset)) if bench.shutdown_hung else set()
    not_json = [line for line in problems if not line.startswith("{") and line not in printed]
    unexpected = [line for line in problems if line.startswith("{") and not _injected_crash(line)]
    groups: dict[tuple[str, str], list[str]] = {}
    for line in unexpected:
        groups.setdefault(cause(json.loads(line)), []).append(line)
    print_groups("elasticd warnings/errors (other than the injected rank-1 crash), grouped:", groups)
    print_not_json(not_json)
    return problems


def write_json(
    path: Path, ns: argparse.Namespace, bench: BenchDaemon, run: Run, rows: list[dict[str, Any]],
    trials: list[Trial], problems: list[str],
) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "config": {
            "repeats": ns.repeats, "restart_repeats": ns.restart_repeats, "only": ns.only,
            "warmup": ns.warmup, "nproc_per_node": NPROC, "max_restarts": MAX_RESTARTS,
            "daemon_args": ns.daemon_arg,
            "start_timeout_s": ns.start_timeout, "restart_timeout_s": ns.restart_timeout,
        },
        **run.header(),
        "aborted": run.aborted,
        "daemon_shutdown_hung": bench.shutdown_hung,
        "daemon_exit_code": bench.daemon.returncode if bench.daemon else None,
        "summary": rows,
        "trials": [asdict(t) | {"flaky": t.flaky} for t in trials],
        "daemon_warnings": problems,
    }, indent=2))  # fmt: skip
    print(f"\nwrote {path}")
