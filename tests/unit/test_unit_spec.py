"""elasticd.terms.spec: nnodes parsing, JobSpec validation, argv, and the JSON form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elasticd.errors import InvalidSpec
from elasticd.terms.ids import new_job_id
from elasticd.terms.options import EntryKind
from elasticd.terms.spec import JobSpec, NodeRange, parse_hang_timeout
from tests import fakes


@pytest.mark.parametrize(
    ("text", "lo", "hi", "shown"),
    [
        ("2", 2, 2, "2"),
        ("1", 1, 1, "1"),
        ("1:4", 1, 4, "1:4"),
        ("3:3", 3, 3, "3"),
        ("4096", 4096, 4096, "4096"),
    ],
)
def test_node_range_parse(text: str, lo: int, hi: int, shown: str) -> None:
    r = NodeRange.parse(text)
    assert (r.min, r.max) == (lo, hi)
    assert str(r) == shown
    assert NodeRange.parse(str(r)) == r


@pytest.mark.parametrize(
    "text", ["0", "3:1", "a", "1:b", "", ":", "1:", ":2", "0:2", "-1", "1:2:3", "100001"]
)
def test_node_range_parse_rejects(text: str) -> None:
    with pytest.raises(InvalidSpec):
        NodeRange.parse(text)


def test_new_job_id_is_name_plus_random_suffix() -> None:
    a, b = new_job_id("train"), new_job_id("train")
    assert a.startswith("train-") and b.startswith("train-")
    assert a != b
    assert len(a) == len("train-") + 8


def make_spec(**overrides: Any) -> JobSpec:
    return fakes.make_spec(
        **(
            {
                "env": {"PATH": "/usr/bin", "MY_VAR_1": "x"},
                "nproc_per_node": 4,
                "max_restarts": 3,
                "stop_grace_s": 5.0,
            }
            | overrides
        )
    )


def test_valid_spec() -> None:
    spec = make_spec()
    assert spec.nproc_per_node == 4


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": ""},
        {"name": "-starts-with-dash"},
        {"name": ".hidden"},
        {"name": "has space"},
        {"name": "slash/name"},
        {"name": "x" * 64},
        {"nproc_per_node": 0},
        {"nproc_per_node": -1},
        {"nproc_per_node": 1025},
        {"max_restarts": -1},
        {"max_restarts": 10_001},
        {"stop_grace_s": -0.1},
        {"stop_grace_s": 3601.0},
        {"stop_grace_s": float("nan")},
        {"entry": ""},
        {"cwd": "relative/dir"},
        {"cwd": ""},
        {"entry": "train.py"},  # a script must be absolute
        {"python": "python3"},  # the interpreter must be absolute for script entries
        {"entry_kind": EntryKind.MODULE, "entry": "pkg.mod", "python": ""},
        {"env": {"1BAD": "x"}},
        {"env": {"BAD-KEY": "x"}},
        {"env": {"": "x"}},
        {"env": {"A=B": "x"}},
        {"env": {"A": "x\x00y"}},
        {"args": ("a\x00",)},
        {"cwd": "/home/\ud800"},
        {"uid": -1},
        {"uid": 2**32 - 1},
        {"gid": 2**32},
        {"uid": True},
        {"user": ""},
        {"user": "a b"},
        {"user": "../x"},
        {"user": "-rf"},
        {"id": "has space"},
        {"id": ""},
        {"submitted_on": "not a node"},
        {"nodes": ("ok", "not ok")},
    ],
    ids=repr,
)
def test_invalid_spec(overrides: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpec):
        make_spec(**overrides)


@pytest.mark.parametrize("name", ["a", "A9", "train_v2.1-final", "x" * 63, "0start"])
def test_valid_names(name: str) -> None:
    assert make_spec(name=name).name == name


@pytest.mark.parametrize(
    "overrides",
    [
        {"nproc_per_node": 1024, "max_restarts": 0, "stop_grace_s": 0.0},
        {"max_restarts": 10_000, "stop_grace_s": 3600.0},
        {"env": {}},
        {"env": {"_X": "1", "a1": "2"}},
        # an executable may be a bare name (resolved on PATH) and needs no python
        {"entry_kind": EntryKind.EXEC, "entry": "my-tool", "python": ""},
        # a module is a dotted name, not a path
        {"entry_kind": EntryKind.MODULE, "entry": "pkg.train"},
        {"uid": 0, "gid": 0, "user": "root"},
        {"uid": 2**32 - 2, "gid": 2**32 - 2, "user": "4294967294"},  # no passwd entry: the uid
        {"user": "svc.build-1@corp", "submitted_on": "node-1"},
        {"user": "machine$"},
    ],
    ids=repr,
)
def test_boundary_values_are_valid(overrides: dict[str, Any]) -> None:
    make_spec(**overrides)


@pytest.mark.parametrize(
    ("kind", "entry", "python", "argv"),
    [
        (EntryKind.SCRIPT, "/w/train.py", "/py", ["/py", "-u", "/w/train.py", "--lr", "0.1"]),
        (EntryKind.MODULE, "pkg.train", "/py", ["/py", "-u", "-m", "pkg.train", "--lr", "0.1"]),
        (EntryKind.EXEC, "/bin/tool", "", ["/bin/tool", "--lr", "0.1"]),
    ],
)
def test_argv(kind: EntryKind, entry: str, python: str, argv: list[str]) -> None:
    spec = make_spec(entry_kind=kind, entry=entry, python=python, args=("--lr", "0.1"))
    assert spec.argv == argv


def test_argv_without_args() -> None:
    assert make_spec(args=()).argv == ["/usr/bin/python3", "-u", "/home/u/train.py"]


def test_to_json_is_plain_json() -> None:
    data = make_spec().to_json()
    assert data["entry_kind"] == "script"
    assert data["args"] == ["--epochs", "2"]
    assert data["nnodes"] == "1:2"
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"entry_kind": EntryKind.MODULE, "entry": "pkg.mod", "nnodes": NodeRange(3, 3)},
        {"entry_kind": EntryKind.EXEC, "entry": "tool", "python": "", "args": (), "env": {}},
    ],
    ids=repr,
)
def test_json_round_trip(overrides: dict[str, Any]) -> None:
    spec = make_spec(**overrides)
    again = JobSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    assert again.entry_kind is spec.entry_kind
    assert isinstance(again.args, tuple)


def _good_json() -> dict[str, Any]:
    return make_spec().to_json()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("entry_kind"),
        lambda d: d.pop("nnodes"),
        lambda d: d.pop("args"),
        lambda d: d.pop("cwd"),
        lambda d: d.update(entry_kind="binary"),
        lambda d: d.update(nnodes="0"),
        lambda d: d.update(nnodes="x:y"),
        lambda d: d.update(args=5),
        lambda d: d.update(unexpected_field=1),
        lambda d: d.update(env=None),
        lambda d: d.update(env={"BAD-KEY": "1"}),
        lambda d: d.update(name=None),
        lambda d: d.update(name="bad name"),
        lambda d: d.update(nproc_per_node="2"),
        lambda d: d.update(nproc_per_node=0),
        lambda d: d.update(cwd="relative"),
        lambda d: d.update(nnodes=2),
        lambda d: d.update(uid="1000"),
        lambda d: d.update(uid=1000.0),
        lambda d: d.update(max_restarts=None),
        lambda d: d.update(stop_grace_s=float("nan")),
        lambda d: d.update(memory_limit_bytes=1),
    ],
)
def test_from_json_malformed_raises_invalid_spec(mutate: Any) -> None:
    data = _good_json()
    mutate(data)
    with pytest.raises(InvalidSpec):
        JobSpec.from_json(data)


@pytest.mark.parametrize("data", [None, [], "spec", 5, {}])
def test_from_json_non_object_raises_invalid_spec(data: Any) -> None:
    with pytest.raises(InvalidSpec):
        JobSpec.from_json(data)


@pytest.mark.parametrize(
    ("key", "value"),
    [("cwd", 5), ("python", None), ("entry", 7), ("env", "ABC"), ("args", "ab")],
)
def test_from_json_wrong_types_raise_invalid_spec(key: str, value: Any) -> None:
    data = _good_json() | {key: value}
    with pytest.raises(InvalidSpec):
        JobSpec.from_json(data)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [(None, (None, False)), ("", (None, False)), ("off", (None, False)), ("auto", (None, True)),
     ("AUTO", (None, True)), ("30", (30.0, False)), ("2.5", (2.5, False))],
)  # fmt: skip
def test_parse_hang_timeout(text: str | None, parsed: tuple[float | None, bool]) -> None:
    assert parse_hang_timeout(text) == parsed


@pytest.mark.parametrize("text", ["soon", "nan", "inf", "-inf", "1e999"])
def test_parse_hang_timeout_rejects(text: str) -> None:
    with pytest.raises(InvalidSpec):
        parse_hang_timeout(text)


def test_hang_timeout_in_the_spec() -> None:
    assert not make_spec().hang_watch
    assert make_spec(hang_timeout_s=30.0).hang_watch and make_spec(hang_timeout_auto=True).hang_watch
    for bad in ({"hang_timeout_s": 0.5}, {"hang_timeout_s": 1e6},
                {"hang_timeout_s": 5.0, "hang_timeout_auto": True}, {"hang_timeout_auto": 1}):  # fmt: skip
        with pytest.raises(InvalidSpec):
            make_spec(**bad)
    spec = make_spec(hang_timeout_s=12.0)
    assert JobSpec.from_json(spec.to_json()) == spec


def test_warm_is_on_by_default_and_preload_names_modules() -> None:
    assert fakes.make_spec().warm is True and fakes.make_spec().preload == ()
    assert fakes.make_spec(preload=("numpy", "a.b_c")).to_json()["preload"] == ["numpy", "a.b_c"]
    for bad in (("os; rm",), ("../x",), ("",), ("a..b",), tuple(f"m{i}" for i in range(33))):
        with pytest.raises(InvalidSpec):
            fakes.make_spec(preload=bad)
    with pytest.raises(InvalidSpec):
        fakes.make_spec(warm="yes")


def test_no_warm_and_preload_on_both_command_lines() -> None:
    from elasticctl.run import build_parser

    ns = build_parser().parse_args(["--no-warm", "--preload", "numpy,json", "--preload", "a.b", "t.py"])
    assert ns.warm is False and ns.preload == ["numpy", "json", "a.b"]
    ns = build_parser().parse_args(["t.py"])
    assert ns.warm is True and ns.preload == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--preload", "os;rm", "t.py"])


def test_numa_binding_and_mig_are_checked() -> None:
    from dataclasses import replace

    from elasticd.errors import InvalidSpec
    from elasticd.terms.head import JobHead

    base = make_spec()
    assert replace(base, numa_binding="socket").numa_binding == "socket"
    with pytest.raises(InvalidSpec, match="numa_binding must be one of"):
        replace(base, numa_binding="everywhere")
    with pytest.raises(InvalidSpec, match="mig must be"):
        replace(base, mig=1)  # type: ignore[arg-type]
    assert JobHead.of(replace(base, mig=True), 100).mig is True


def test_gpu_options_are_stored_only_when_asked_for() -> None:
    from dataclasses import replace

    from elasticd.terms.head import JobHead

    base = make_spec()
    assert "numa_binding" not in base.to_json() and "mig" not in base.to_json()
    assert "mig" not in JobHead.of(base, 100).to_json()
    asked = replace(base, numa_binding="node", mig=True)
    assert JobSpec.from_json(asked.to_json()) == asked
    assert JobHead.of(asked, 100).to_json()["mig"] is True
    assert JobSpec.from_json(base.to_json()) == base


def test_master_port_is_checked_and_stored_only_when_named() -> None:
    from dataclasses import replace

    from elasticd.errors import InvalidSpec

    base = make_spec()
    assert "master_port" not in base.to_json()
    named = replace(base, master_port=29500)
    assert JobSpec.from_json(named.to_json()) == named
    for bad in (80, 0, 65536, True, "29500"):
        with pytest.raises(InvalidSpec, match=r"master_port must be 1024\.\.65535"):
            replace(base, master_port=bad)  # type: ignore[arg-type]
