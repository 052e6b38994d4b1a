"""elasticctl.torchrun: every flag torchrun accepts, in both spellings, is mapped, noted or refused."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, cast

import pytest

from elasticctl import run, torchrun
from elasticctl.torchrun import FLAGS, FlagError, Treat, interpret, nproc, rdzv_conf

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "elasticrun.md"


def parse(*argv: str) -> argparse.Namespace:
    return run.build_parser().parse_args([*argv, "train.py", "--lr", "1"])


def test_every_flag_of_torchs_own_parser_is_in_the_table() -> None:
    torch_run = pytest.importorskip("torch.distributed.run")
    theirs = {s for a in torch_run.get_args_parser()._actions for s in a.option_strings} - {"-h", "--help"}
    ours = {s for flag in FLAGS for s in flag.spellings}
    assert theirs - ours == set(), "torchrun flags elasticrun does not know"
    assert ours - theirs == set(), "flags in the table that torchrun does not have"


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.name)
def test_each_spelling_parses(flag: torchrun.Flag) -> None:
    for spelling in flag.spellings:
        ns = parse(spelling, "3") if flag.value else parse(spelling)
        assert getattr(ns, flag.key) in ("3", True)


def test_script_args_are_the_scripts_even_when_they_look_like_flags() -> None:
    ns = run.build_parser().parse_args(["--nproc_per_node", "2", "train.py", "--nnodes", "5", "-m"])
    assert ns.training_script == "train.py" and ns.training_script_args == ["--nnodes", "5", "-m"]
    assert ns.nproc_per_node == "2" and ns.nnodes == "1:1" and ns.max_restarts == 0  # torchrun's defaults


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.treat is Treat.REFUSED], ids=lambda f: f.name)
def test_refused_flags_say_why(flag: torchrun.Flag) -> None:
    ns = parse(flag.name, "x") if flag.value else parse(flag.name)
    with pytest.raises(FlagError, match=f"{flag.name} is not supported: .+"):
        interpret(ns, lambda: 0)


def test_noted_flags_give_one_line_each_and_defaults_none() -> None:
    ns = parse("--standalone", "--rdzv_backend", "c10d", "--rdzv-endpoint", "h:1", "--monitor_interval", "5")
    notes = interpret(ns, lambda: 0).notes
    assert [n.split(":")[0] for n in notes] == ["--rdzv-backend", "--rdzv-endpoint", "--standalone",
                                                  "--monitor-interval"]  # fmt: skip
    assert all("\n" not in n and "not needed" in n for n in notes)
    assert interpret(parse("--start-method", "spawn", "--rdzv-backend", "static"), lambda: 0).notes == []


def test_mapped_values() -> None:
    ns = parse(
        "--rdzv-id",
        "exp7",
        "--rdzv_conf",
        "join_timeout=90,last_call_timeout=3,read_timeout=5",
        "--shutdown-timeout",
        "12",
        "--local-ranks-filter",
        "0,2",
        "--nproc-per-node",
        "auto",
    )
    mapped = interpret(ns, lambda: 4)
    assert mapped.fields == {"job_id": "exp7", "join_timeout_s": 90.0, "last_call_s": 3.0,
                             "stop_grace_s": 12.0, "nproc_per_node": 4}  # fmt: skip
    assert mapped.local_ranks == frozenset({0, 2})
    with pytest.raises(FlagError):
        interpret(parse("--local-ranks-filter", "a,b"), lambda: 0)


def test_nproc_per_node_as_torchrun_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert nproc("3", lambda: 8) == 3
    assert (nproc("gpu", lambda: 8), nproc("auto", lambda: 8)) == (8, 8)
    assert (nproc("cpu", lambda: 8), nproc("auto", lambda: 0)) == (6, 6)
    assert nproc("0", lambda: 8) == 0  # numbers go to the daemon, which checks them with the spec
    for bad in ("-1", "many"):
        with pytest.raises(FlagError):
            nproc(bad, lambda: 0)
    with pytest.raises(FlagError, match="no GPU"):
        nproc("gpu", lambda: 0)


def test_defaults_come_from_pet_variables_as_in_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    ns = parse()
    assert (ns.nproc_per_node, ns.max_restarts) == ("3", "2")


def test_rdzv_conf_ignores_keys_of_other_backends_and_checks_numbers() -> None:
    assert rdzv_conf("timeout=5,is_host=1") == {}
    with pytest.raises(FlagError):
        rdzv_conf("join_timeout=soon")


def test_the_elasticrun_guide_has_the_table() -> None:
    assert torchrun.table() in GUIDE.read_text()


def test_a_line_joins_only_a_live_job_of_its_own_user() -> None:
    from elasticctl.entry import UsageError
    from elasticctl.run import joinable

    job: Any = {"id": "exp7", "user": "alice", "state": "RUNNING"}
    assert joinable(job, "alice") is job
    with pytest.raises(UsageError, match="another user"):
        joinable(job, "bob")
    with pytest.raises(UsageError, match=r"has ended \(SUCCEEDED\).*elasticctl rm exp7"):
        joinable(job | {"state": "SUCCEEDED"}, "alice")


def test_elasticrun_nodes_limits_where_the_job_may_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """elasticd's own flag, for an sbatch line run on every node of an allocation."""
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    args, _, _ = run.submit_args(parse("--nodes", "n1, n2,"), cast(Any, None))
    assert args.nodes == ["n1", "n2"]
    assert run.submit_args(parse(), cast(Any, None))[0].nodes == []


@pytest.mark.parametrize(
    ("given", "value"),
    [("node", "node"), ("socket", "socket"), ("exclusive", "exclusive"), ("core-complex", "core-complex"),
     ("core_complex", "core-complex")],
)  # fmt: skip
def test_numa_binding_is_mapped(given: str, value: str) -> None:
    assert interpret(parse("--numa-binding", given), lambda: 0).fields["numa_binding"] == value
    assert interpret(parse("--numa_binding", given), lambda: 0).fields["numa_binding"] == value


def test_numa_binding_refuses_other_values() -> None:
    with pytest.raises(FlagError, match="--numa-binding takes one of"):
        interpret(parse("--numa-binding", "everywhere"), lambda: 0)


def test_master_port_is_mapped_and_master_addr_only_noted() -> None:
    mapped = interpret(parse("--master-addr", "localhost", "--master_port", "29500"), lambda: 0)
    assert mapped.fields["master_port"] == 29500
    assert [n.split(":")[0] for n in mapped.notes] == ["--master-addr"]
    assert "master_port" not in interpret(parse(), lambda: 0).fields
    with pytest.raises(FlagError, match="--master-port takes a port number"):
        interpret(parse("--master-port", "http"), lambda: 0)
