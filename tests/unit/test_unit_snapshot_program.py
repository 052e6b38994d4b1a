"""The snapshot keeper's program and the daemon agree: the keeper's parts need nothing but the
standard library (the job's python need not be able to import elasticd), its protocol module runs
first so the later parts take its names, and nothing the protocol defines is written again."""

from __future__ import annotations

import ast
import sys
from importlib import resources
from pathlib import Path

from elasticd.workers.snapshot_program import protocol
from elasticd.workers.warm import snapshotkeeper as keeper

PROGRAM = Path(str(resources.files(keeper.PROGRAM)))


def _guard(node: ast.stmt) -> bool:
    """``if __name__ != "<the keeper's name>":``: imports the daemon's tests and mypy make, which
    in the keeper are globals already (the parts share one namespace)."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and isinstance(test.ops[0], ast.NotEq)
        and isinstance(test.comparators[0], ast.Constant)
    )


def test_the_keeper_runs_its_protocol_first() -> None:
    assert keeper.PARTS[0] == "protocol.py"
    assert all((PROGRAM / part).is_file() for part in keeper.PARTS)


def test_the_guards_name_the_keeper_as_the_loader_does() -> None:
    assert keeper.KEEPER.name == protocol.KEEPER_NAME
    assert f"types.ModuleType('{protocol.KEEPER_NAME}')" in keeper.KEEPER.loader(0, 0)
    for part in keeper.PARTS:
        tree = ast.parse((PROGRAM / part).read_text())
        names = [
            n.comparators[0].value
            for n in ast.walk(tree)
            if isinstance(n, ast.Compare)
            and isinstance(n.left, ast.Name)
            and n.left.id == "__name__"
            and isinstance(n.comparators[0], ast.Constant)
        ]
        assert set(names) <= {protocol.KEEPER_NAME}, part


def test_the_keepers_parts_import_the_standard_library_only() -> None:
    for part in keeper.PARTS:
        tree = ast.parse((PROGRAM / part).read_text())
        guarded = {
            n.lineno
            for top in tree.body
            if _guard(top)
            for n in ast.walk(top)
            if isinstance(n, ast.Import | ast.ImportFrom)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{part}: relative import"
                names = [node.module or ""]
            else:
                continue
            for name in names:
                own = name == keeper.PROGRAM or name.startswith(keeper.PROGRAM + ".")
                sibling = own and node.lineno in guarded
                stdlib = name.split(".")[0] in sys.stdlib_module_names
                assert stdlib or sibling, f"{part}:{node.lineno} imports {name}"


def test_no_module_writes_a_protocol_name_again() -> None:
    """The protocol's constants are written once: the keeper's other parts, the workers' side and
    the daemon's side (``warm.snapshotkeeper``) take them from it."""
    source = ast.parse((PROGRAM / "protocol.py").read_text())
    defined = {
        t.id
        for node in source.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.isupper()
    }
    assert {"SOCKET_ENV", "MAX_MESSAGE", "HEADER"} <= defined
    for path in [*PROGRAM.glob("*.py"), Path(keeper.__file__)]:
        if path == PROGRAM / "protocol.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                assert not names & defined, f"{path}: {sorted(names & defined)}"


def test_the_daemon_knows_every_report_the_keeper_sends_and_waits_long_enough() -> None:
    from elasticd.workers.snapshot_program import filing

    tree = ast.parse(Path(filing.__file__).read_text())
    told = {
        protocol.Report[node.attr]
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Report"
    }
    assert told == set(protocol.Report)  # each typed, and each one decode_control reads back
    for report in protocol.Report:
        sent = protocol.WriteReport(report, 3, took_s=0.5, reason="r", pid=9)
        back = protocol.decode_control(protocol.encode_control(sent))
        assert isinstance(back, protocol.WriteReport) and back.report is report
    assert keeper.PERSIST_TIMEOUT_S > filing.WRITE_TIMEOUT_S
