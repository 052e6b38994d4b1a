"""The snapshot keeper's program and the daemon agree: the keeper's parts need nothing but the
standard library (the job's python need not be able to import elasticd), its protocol module runs
first so the later parts take its names, and nothing the protocol defines is written again."""

from __future__ import annotations

import ast
import os
import sys
from importlib import resources
from pathlib import Path

import pytest

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


def _defined(part: str) -> set[str]:
    names = set()
    for node in ast.parse((PROGRAM / part).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_no_two_parts_define_one_name() -> None:
    """The parts share one namespace: a name defined twice would silently be the later one's."""
    seen: dict[str, str] = {}
    for part in keeper.PARTS:
        for name in _defined(part):
            assert name not in seen, f"{part} defines {name} again ({seen[name]} did)"
            seen[name] = part


def test_the_typed_messages_work_in_the_keepers_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as the loader runs them (one module, registered under the keeper's name, the guarded
    imports skipped), the dataclasses, the parser and the keeper's ``match`` work alike."""
    import types

    program = types.ModuleType(protocol.KEEPER_NAME)
    monkeypatch.setitem(sys.modules, protocol.KEEPER_NAME, program)
    for part in keeper.PARTS[:-1]:  # not ``main``: it would start serving
        exec(compile((PROGRAM / part).read_text(), part, "exec"), program.__dict__)
    g = program.__dict__
    sent = g["Begin"]("/c.pt", 0, 1, 100)
    request = g["parse_request"](g["encode_message"](sent))
    assert request == sent and type(request).OP is g["Op"].BEGIN
    reply, fd = g["Keeper"](64 << 20).handle(request)
    os.close(fd)
    assert type(reply) is g["Begun"] and reply.capacity >= 100
    assert g["parse_transfer"](g["encode_message"](g["Get"]("c", 0, 1, "0" * 32))).nonce == "0" * 32


def test_the_keepers_program_fits_the_pipe_it_is_sent_over() -> None:
    from elasticd.workers.proctree import helper

    assert len(keeper.KEEPER.source()) < helper.PIPE_BYTES
