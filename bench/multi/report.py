"""bench_multi's output: one line per trial, the summary table, the launchers' CPU, the samples,
every daemon's warnings, and the JSON file."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.daemonlog import cause, print_groups, print_not_json
from harness.runinfo import Run

from multi.cluster import Cluster
from multi.trial import (
    DAEMON_STOP_GRACE_S,
    DRAIN_AFTER_STEPS,
    LEASE_TTL,
    MAX_RESTARTS,
    STEPS_AFTER_RESUME,
    TORCHRUN_RDZV_CONF,
    WARM_S,
    Trial,
)

ROWS = (
    ("loss", "rank0", "value_s", "loss: node of rank 0/store killed -> survivor at world 1"),
    ("loss", "rank0", "relaunch_s", "  of which: kill -> survivor's new worker launched"),
    ("loss", "other", "value_s", "loss: other node killed -> survivor at world 1"),
    ("loss", "other", "relaunch_s", "  of which: kill -> survivor's new worker launched"),
    ("drain", "drain", "value_s", "drain: leave request -> next step at world 1"),
    ("drain", "drain", "relaunch_s", "  of which: request -> survivor's new worker launched"),
    ("drain", "drain", "steps_lost", "drain: steps lost (ledger lines - distinct steps)"),
)


def fmt_v(v: float | None, metric: str = "value_s") -> str:
    if v is None:
        return "-"
    return str(int(v)) if metric == "steps_lost" else f"{v:.3f}"


def fmt_trial(tr: Trial) -> str:
    status = "ok" if tr.ok else tr.outcome.upper()
    parts = [f"{tr.scenario:<5} {tr.variant:<5} #{tr.index} {tr.launcher:<8} {status:<7}"]
    if tr.scenario == "loss":
        parts.append(
            f"recovery={fmt_v(tr.value_s)}s relaunch={fmt_v(tr.relaunch_s)}s detect={fmt_v(tr.detect_s)}s"
        )
        parts.append(f"victim={tr.victim} (had rank 0: {tr.victim_had_rank0})")
        parts.append(f"ranks@2={tr.ranks} rounds={tr.rounds_seen}")
        if tr.recovered_round:
            parts.append(f"world1-round={tr.recovered_round}")
    else:
        parts.append(
            f"resume={fmt_v(tr.value_s)}s relaunch={fmt_v(tr.relaunch_s)}s detect={fmt_v(tr.detect_s)}s "
            f"lost={fmt_v(tr.steps_lost, 'steps_lost')}"
        )
        parts.append(
            f"lines={tr.ledger_lines} distinct={tr.distinct_steps} last@2={tr.last_step_before} "
            f"first@1={tr.resume_step} worlds={tr.worlds} victim={tr.victim} ranks@2={tr.ranks}"
        )
        if tr.request_s is not None and tr.launcher == "elasticd":
            parts.append(f"drain-cmd={tr.request_s:.2f}s")
    if tr.startup_s is not None:
        parts.append(f"startup={tr.startup_s:.1f}s")
    if tr.launcher_cpu:
        cpu = "/".join(f"{v:.0f}%" for v in tr.launcher_cpu.values())
        parts.append(f"{'daemon' if tr.launcher == 'elasticd' else 'agent'}-cpu={cpu}")
    if tr.etcd_cpu is not None:
        parts.append(f"etcd-cpu={tr.etcd_cpu:.0f}%")
    if tr.state:
        parts.append(f"state={tr.state} restarts={tr.restarts}")
    parts.append(f"wall={fmt_v(tr.wall_s)}s")
    if tr.leftovers_killed:
        parts.append(f"leftovers_killed={len(tr.leftovers_killed)}")
    if tr.error:
        parts.append(f"({tr.error})")
    return " ".join(parts)


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    rows = []
    for scenario, variant, metric, name in ROWS:
        mine = [t for t in trials if t.scenario == scenario and t.variant == variant]
        if not mine:
            continue
        row: dict[str, Any] = {"scenario": name, "metric": metric}
        for launcher in ("elasticd", "torchrun"):
            ts = [t for t in mine if t.launcher == launcher]
            values = [getattr(t, metric) for t in ts]
            samples = [v for v in values if v is not None]
            row[launcher] = {
                "median": statistics.median(samples) if samples else None,
                "min": min(samples, default=None),
                "max": max(samples, default=None),
                "n": len(samples),
                "trials": len(ts),
                "outcomes": {o: sum(t.outcome == o for t in ts) for o in sorted({t.outcome for t in ts})},
                "samples": values,
            }
        e, r = row["elasticd"]["median"], row["torchrun"]["median"]
        row["ratio"] = e / r if e is not None and r else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'scenario':<58} {'elasticd med':>12} {'torchrun med':>12} {'ratio e/t':>9}  "
        f"{'elasticd n (not ok)':<24} {'torchrun n (not ok)':<24}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        unit = "" if row["metric"] == "steps_lost" else "s"

        def counts(s: dict[str, Any]) -> str:
            bad = " ".join(f"{o}={k}" for o, k in s["outcomes"].items() if o != "ok")
            return f"{s['n']}/{s['trials']}" + (f" ({bad})" if bad else "")

        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        e = fmt_v(row["elasticd"]["median"], row["metric"])
        t = fmt_v(row["torchrun"]["median"], row["metric"])
        print(
            f"{row['scenario']:<58} {e + unit:>12} {t + unit:>12} {ratio:>9}  "
            f"{counts(row['elasticd']):<24} {counts(row['torchrun']):<24}"
        )
    print(
        "  n = trials with a sample / trials run. Not ok: survivor-exited = the surviving launcher exited\n"
        "  instead of going on (torchrun: its agent; elasticd: its daemon); job-ended = after the leave the\n"
        "  survivor stopped training too and nothing restarted it (no resume; steps lost then counts the\n"
        "  ledger as it stands); timeout = no result within the trial timeout; error = see the trial line.\n"
        "  ratio e/t < 1: elasticd faster (for steps lost: fewer)."
    )


def cpu_summary(trials: list[Trial]) -> dict[str, float | None]:
    """Median over trials of the launcher processes' own mean CPU (each), and of etcd's."""

    def med(values: list[float]) -> float | None:
        values = [v for v in values if v == v]  # no NaN
        return round(statistics.median(values), 1) if values else None

    return {
        "elasticd_daemon_pct": med(
            [v for t in trials if t.launcher == "elasticd" for v in t.launcher_cpu.values()]
        ),
        "etcd_pct": med([t.etcd_cpu for t in trials if t.etcd_cpu is not None]),
        "torchrun_agent_pct": med(
            [v for t in trials if t.launcher == "torchrun" for v in t.launcher_cpu.values()]
        ),
    }


def print_cpu(cpu: dict[str, float | None]) -> None:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}%"

    print(
        "\nlaunchers' own CPU (mean % of one core over each process's life, median over trials): "
        f"elasticd daemon {pct(cpu['elasticd_daemon_pct'])} each + etcd {pct(cpu['etcd_pct'])}; "
        f"torchrun agent {pct(cpu['torchrun_agent_pct'])} each (the machine has {os.cpu_count()} cores)"
    )


def print_samples(rows: list[dict[str, Any]]) -> None:
    print("\nsamples (in trial order; '-' = no sample):")
    for row in rows:
        for launcher in ("elasticd", "torchrun"):
            vals = " ".join(fmt_v(v, row["metric"]) for v in row[launcher]["samples"])
            print(f"  {row['scenario']:<58} {launcher:<8} {vals}")


def report_daemon_problems(bench: Cluster) -> dict[tuple[str, str], list[str]]:
    """Print every daemon's warnings and errors, grouped, and its stderr lines that are not log
    records; the groups, for the JSON output."""
    warnings: dict[tuple[str, str], list[str]] = {}
    not_json: list[str] = []
    for daemon in bench.daemons:
        for line in daemon.lines(levels=("warning", "error", "critical")):
            try:
                rec = json.loads(line)
            except ValueError:
                not_json.append(f"{daemon.node_id}: {line}")
                continue
            warnings.setdefault(cause(rec), []).append(f"{daemon.node_id}: {line}")
    title = "elasticd warnings/errors over all trials, grouped (a killed node makes some of them expected):"
    print_groups(title, warnings)
    print_not_json(not_json)
    return warnings


def write_json(
    path: Path, ns: argparse.Namespace, bench: Cluster, run: Run, source_end: dict[str, Any],
    rows: list[dict[str, Any]], cpu: dict[str, float | None], trials: list[Trial],
    warnings: dict[tuple[str, str], list[str]],
) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "config": {
            "repeats": ns.repeats, "only": ns.only, "timeout_s": ns.timeout, "lease_ttl": LEASE_TTL,
            "max_restarts": MAX_RESTARTS, "warm_s": WARM_S, "drain_after_steps": DRAIN_AFTER_STEPS,
            "steps_after_resume": STEPS_AFTER_RESUME, "torchrun_rdzv_conf": TORCHRUN_RDZV_CONF,
            "daemon_stop_grace_s": DAEMON_STOP_GRACE_S,
        },
        **run.header(),
        "elasticd_source_end": source_end,
        "summary": rows,
        "launcher_cpu": cpu,
        "trials": [asdict(t) | {"outcome": t.outcome} for t in trials],
        "daemon_warnings": {f"{e}: {w}": lines for (e, w), lines in warnings.items()},
        "daemon_shutdown_hung": bench.shutdown_hung,
    }, indent=2))  # fmt: skip
    print(f"\nwrote {path}")
