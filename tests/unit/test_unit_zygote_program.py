"""The zygote's program and the daemon agree: the constants they share are one file, which both
load, and the program needs nothing but the standard library (the job's python need not be able
to import elasticd)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

from elasticd.workers import group
from elasticd.workers.proctree import spawn
from elasticd.workers.warm import spawn as zygote_spawn
from elasticd.workers.zygote_program import shared

PROGRAM = Path(str(resources.files(zygote_spawn.PROGRAM)))
NAMES = ("SPAWN_FAILED", "PARENT_GONE", "BOOT_FILE", "PROGRAM_NAME")
# The last part run in the zygote's place: it reports what the program's namespace holds.
PROBE = (
    f"import json, os\nwanted = {NAMES!r}\n"
    "seen = {n: v for n, v in globals().items() if n in wanted} | {'name': __name__}\n"
    "os.write(1, json.dumps(seen).encode())\n"
)


def parts() -> list[Path]:
    return sorted(p for p in PROGRAM.glob("*.py") if p.name != "__init__.py")


def test_every_module_of_the_program_is_shipped_shared_first() -> None:
    assert {p.name for p in parts()} == set(zygote_spawn.BOOT_PARTS)
    assert zygote_spawn.BOOT_PARTS[0] == "shared.py"  # its names are globals for the later parts


def test_the_daemon_takes_the_shared_values_from_the_program() -> None:
    # vars(): the names are the modules' own imports, which they do not re-export
    assert (
        vars(spawn)["SPAWN_FAILED"] is shared.SPAWN_FAILED
        and vars(spawn)["PARENT_GONE"] is shared.PARENT_GONE
    )
    assert vars(zygote_spawn)["BOOT_FILE"] is shared.BOOT_FILE
    assert zygote_spawn.ZYGOTE.name == shared.PROGRAM_NAME
    assert f"types.ModuleType('{shared.PROGRAM_NAME}')" in zygote_spawn.ZYGOTE.loader(0, 0)
    assert vars(group)["SPAWN_FAILED"] is shared.SPAWN_FAILED


def test_no_module_of_workers_writes_a_shared_name_again() -> None:
    base = Path(spawn.__file__).parent.parent
    for path in base.rglob("*.py"):
        if path == PROGRAM / "shared.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                assert not names & set(NAMES), f"{path}: {sorted(names & set(NAMES))}"


def test_the_program_in_an_isolated_interpreter_sees_the_daemons_values() -> None:
    """The real loader, in a python that cannot import elasticd (``-I -S``: no site-packages, no
    cwd or PYTHONPATH on ``sys.path``), runs the shipped parts but the last and then a probe."""
    parts = zygote_spawn.ZYGOTE.source().split(b"\0")
    program = b"\0".join([*parts[:-1], PROBE.encode()])
    src_r, src_w = os.pipe()
    try:
        os.write(src_w, program)
        os.close(src_w)
        src_w = -1
        loader = zygote_spawn.ZYGOTE.loader(src_r, -1)
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", loader],
            pass_fds=(src_r,),
            capture_output=True,
            timeout=30,
            check=True,
        )
    finally:
        os.close(src_r)
        if src_w >= 0:
            os.close(src_w)
    seen = json.loads(out.stdout)
    assert seen == {n: getattr(shared, n) for n in NAMES} | {"name": shared.PROGRAM_NAME}


def stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def guarded(tree: ast.Module) -> set[int]:
    """Line numbers of the imports under ``if __name__ != PROGRAM_NAME:`` (the daemon's tests and
    mypy only: in the zygote those names are globals already)."""
    lines = set()
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
            and isinstance(test.ops[0], ast.NotEq)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == shared.PROGRAM_NAME
        ):
            lines |= {n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)}
    return lines


def test_the_program_imports_the_standard_library_only() -> None:
    own = zygote_spawn.PROGRAM
    for path in parts():
        tree = ast.parse(path.read_text())
        allowed = guarded(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"
                names = [node.module or ""]
            else:
                continue
            for name in names:
                sibling = name.startswith(own + ".") and node.lineno in allowed
                assert stdlib(name) or sibling, f"{path.name}:{node.lineno} imports {name}"


def test_the_warm_parent_warms_what_an_optimizer_imports_and_forks_without_it_when_torch_lacks_it() -> None:
    """An optimizer's constructor imports ``torch._dynamo`` (about 1 s): the warm parent imports
    it with torch, so a restarted worker does not; a module that will not import is skipped."""
    code = (
        "import sys\n"
        "from elasticd.workers.zygote_program import boot\n"
        "assert boot._preload({'torch': True, 'preload': []}) is None\n"
        "assert 'torch._dynamo' in sys.modules\n"
        "boot.WARM_AFTER_TORCH = ('no_such_module_of_torch',)\n"
        "assert boot._preload({'torch': True, 'preload': ['json']}) is None\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
