"""elasticctl's argument handling, --version and shell completion (no daemon needed)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from elasticctl import commands
from elasticctl.cli import main
from elasticctl.commands import REGISTRY
from elasticctl.commands.base import Command
from elasticctl.parser import build_parser
from elasticd import __version__
from elasticd.daemon.main import build_parser as daemon_parser
from elasticd.daemon.main import main as daemon_main


@pytest.mark.parametrize(
    "argv",
    [
        ["--timeout", "3", "--socket", "/s", "ping"],
        ["ping", "--timeout", "3", "--socket", "/s"],
        ["--socket", "/other", "--timeout", "9", "ping", "--timeout", "3", "--socket", "/s"],
    ],
)
def test_connection_options_before_or_after_the_command(argv: list[str]) -> None:
    ns = build_parser().parse_args(argv)
    assert ns.timeout == 3.0 and ns.socket == Path("/s")


def test_every_command_the_parser_knows_has_a_handler() -> None:
    """The command line (``elasticctl.parser``) is built from the commands that run
    (``elasticctl.commands.REGISTRY``); ``completion`` is the one command that needs no daemon."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    daemon = {name for name, command in REGISTRY.items() if isinstance(command, Command)}
    assert set(sub.choices) == daemon | {"completion"} == set(REGISTRY)


def test_every_command_module_is_in_the_registry() -> None:
    """Nothing registers itself: a module added to ``elasticctl/commands/`` is listed in ``REGISTRY``."""
    package = Path(commands.__file__).parent
    modules = {f"elasticctl.commands.{p.stem}" for p in package.glob("*.py")} - {
        "elasticctl.commands.__init__",
        "elasticctl.commands.base",
    }
    assert {command.run.__module__ for command in REGISTRY.values()} == modules


def test_the_client_mirrors_the_daemons_commands() -> None:
    """One client command per control command, in a module of the same name
    (``elasticctl/commands/<name>.py`` beside ``elasticd/control/commands/<name>.py``)."""
    from elasticd.control.commands import REGISTRY as DAEMON

    asks = {name: command for name, command in REGISTRY.items() if isinstance(command, Command)}
    assert set(asks) == set(DAEMON)
    for name, command in asks.items():
        assert command.run.__module__.rpartition(".")[2] == DAEMON[name].handler.__module__.rpartition(".")[2]


def test_defaults_without_connection_options() -> None:
    ns = build_parser().parse_args(["status"])
    assert ns.timeout == 15.0 and ns.socket is None


def test_submit_script_args_after_double_dash() -> None:
    ns = build_parser().parse_args(["submit", "--nproc-per-node", "4", "train.py", "--", "--lr", "0.1"])
    assert ns.target == "train.py" and ns.script_args == ["--lr", "0.1"] and ns.nproc_per_node == 4
    keep = build_parser().parse_args(["submit", "train.py", "--", "--", "x"])
    assert keep.script_args == ["--", "x"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"elasticctl {__version__}"


def test_elasticd_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        daemon_main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"elasticd {__version__}"


def test_elasticd_boolean_flag_both_ways() -> None:
    assert daemon_parser().parse_args(["--allow-root-jobs"]).allow_root_jobs is True
    assert daemon_parser().parse_args(["--no-allow-root-jobs"]).allow_root_jobs is False
    assert daemon_parser().parse_args([]).allow_root_jobs is None  # not given: the file or env decides


def completion(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0  # no daemon needed
    return capsys.readouterr().out


def test_bash_completion(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "elasticctl.bash"
    script.write_text(completion("bash", capsys))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # What bash completes, with the script loaded: commands, a command's flags, choices.
    probe = (
        f"source {script}\n"
        'complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=();\n'
        '  _shtab_elasticctl; echo "${COMPREPLY[*]}"; }\n'
        "complete_words elasticctl su\n"
        "complete_words elasticctl submit --nproc\n"
        "complete_words elasticctl completion ''\n"
        "complete_words elasticctl dr\n"
    )
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # (torchrun's underscore spelling is a flag too)
    assert res.stdout.splitlines() == ["submit", "--nproc-per-node --nproc_per_node", "bash zsh", "drain"]


def test_zsh_completion(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = completion("zsh", capsys)
    assert text.startswith("#compdef elasticctl")
    for command in ("submit", "status", "kill", "logs", "nodes", "drain", "undrain", "ping", "completion"):
        assert f"\n    {command}:" in text
    if shutil.which("zsh") is None:
        return  # zsh is not installed here: its syntax check is skipped
    script = tmp_path / "_elasticctl"
    script.write_text(text)
    assert subprocess.run(["zsh", "-n", str(script)], capture_output=True).returncode == 0


def test_completion_of_an_unknown_shell_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["completion", "cmd.exe"])
    assert info.value.code == 2


def test_submit_speaks_torchruns_vocabulary(tmp_path: Path) -> None:
    from elasticctl.commands.submit import submit_request

    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["submit", "--nproc_per_node", "auto", "--max_restarts", "1", "--standalone", "--rdzv-id", "exp-3",
            "--rdzv_conf", "join_timeout=30", "--shutdown_timeout", "4", "--local-ranks-filter", "1",
            "--cwd", str(tmp_path), "train.py"]  # fmt: skip
    ns = build_parser().parse_args(argv)
    args, mapped = submit_request(ns, lambda: 3)
    assert (args.nproc_per_node, args.max_restarts, args.job_id) == (3, 1, "exp-3")
    assert (args.join_timeout_s, args.stop_grace_s) == (30.0, 4.0)
    assert mapped.local_ranks == frozenset({1}) and [n.split(":")[0] for n in mapped.notes] == [
        "--standalone"
    ]


def test_submit_priority_is_sent_and_a_negative_one_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from elasticctl.commands.submit import submit_args

    (tmp_path / "train.py").write_text("")
    ns = build_parser().parse_args(["submit", "--priority", "7", "--cwd", str(tmp_path), "train.py"])
    assert submit_args(ns).priority == 7
    plain = build_parser().parse_args(["submit", "--cwd", str(tmp_path), "train.py"])
    assert submit_args(plain).priority == 0
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["submit", "--priority", "-1", "train.py"])
    assert info.value.code == 2 and "--priority is an integer >= 0" in capsys.readouterr().err


def test_nodes_shows_how_full_etcd_is_on_one_line() -> None:
    from elasticctl.render import etcd_line

    view = {"level": "high", "db_size": 1700 << 20, "db_size_in_use": 900 << 20, "quota_bytes": 2 << 30,
            "high_water_bytes": 1638 << 20, "alarms": [], "read_at": 1.0}  # fmt: skip
    line = etcd_line(view)  # type: ignore[arg-type]
    assert line == (
        "etcd: 1.7 GiB of 2.0 GiB (83%, 900.0 MiB in use), level high (new jobs refused above 1.6 GiB)"
    )
    alarmed = etcd_line(view | {"level": "full", "alarms": ["NOSPACE"]})  # type: ignore[arg-type]
    assert alarmed.endswith(", ALARM NOSPACE")
    unknown = etcd_line(view | {"level": "unknown", "db_size": None, "db_size_in_use": None})  # type: ignore[arg-type]
    assert unknown.startswith("etcd: size unknown, quota 2.0 GiB")


def test_nodes_shows_each_nodes_snapshot_bound_and_where_it_came_from() -> None:
    from elasticctl.render import nodes_table
    from elasticd.node.registry import NodeRecord

    derived = NodeRecord("n1", 2, snapshot_bytes=12 << 30, snapshot_source="derived").to_json()
    off = NodeRecord("n2", 2, snapshot_source="set").to_json()
    older = NodeRecord("n3", 2).to_json()
    lines = nodes_table([derived, off, older]).splitlines()  # type: ignore[list-item]
    assert "SNAPSHOTS" in lines[0].split()
    assert "12.0 GiB (derived)" in lines[1] and "off (set)" in lines[2]
    column = lines[0].index("SNAPSHOTS")
    assert lines[3][column] == "-"


def test_nodes_shows_whether_each_node_filters_its_jobs_ports_and_why_not() -> None:
    from elasticctl.render import nodes_table
    from elasticd.node.registry import NodeRecord

    on = NodeRecord("n1", 2, port_filter="on", port_filter_detail="uid").to_json()
    why = "no nft binary (install the nftables package)"
    off = NodeRecord("n2", 2, port_filter="off", port_filter_detail=why).to_json()
    older = NodeRecord("n3", 2).to_json()
    lines = nodes_table([on, off, older]).splitlines()  # type: ignore[list-item]
    column = lines[0].index("PORTS")
    assert lines[1][column:].startswith("on (uid)") and lines[2][column:].startswith("off")
    assert lines[3][column] == "-"
    assert lines[-1] == "n2: port filter off: no nft binary (install the nftables package)"


class _InterruptedOnLoad(types.ModuleType):
    """A module whose names raise KeyboardInterrupt: Ctrl-C while ``from ... import`` runs."""

    def __getattr__(self, name: str) -> object:
        raise KeyboardInterrupt


def test_ctrl_c_before_following_begins_leaves_the_job_running_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from elasticctl.commands import submit

    script = tmp_path / "train.py"
    script.write_text("")
    asked: list[str] = []

    class OneSubmit:
        def request(self, command: str, args: object) -> dict[str, object]:
            asked.append(command)
            return {"id": "j-1", "state": "RUNNING"}

    monkeypatch.setitem(sys.modules, "elasticctl.follow", _InterruptedOnLoad("elasticctl.follow"))
    ns = build_parser().parse_args(["submit", "--follow", "--nproc-per-node", "1", str(script)])
    assert submit.run(OneSubmit(), ns) == 130  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert out == "j-1\n" and "stopped following; j-1 keeps running" in err
    assert asked == ["submit"]  # nothing asked to stop the job
