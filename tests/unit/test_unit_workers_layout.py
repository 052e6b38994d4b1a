"""The layout of ``elasticd.workers``: no import cycle between its modules or its packages, and
imports only downwards through its layers.

Imports are read from the source (``ast``), wherever they are: at the top, in a function, or under
``TYPE_CHECKING``; a cycle that only the type checker sees is a cycle for the reader too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import elasticd.workers
from tests import importgraph
from tests.importgraph import acyclic

ROOT = "elasticd.workers"
BASE = Path(elasticd.workers.__file__).parent

# Bottom to top. A module imports only from a lower layer, or from its own package.
LAYERS = (
    ("zygote_program", "snapshot_program", "check_program"),
    ("proctree", "cgroups", "numa_memory"),
    ("group",),
    ("warm",),
)
# Within cgroups, bottom to top: each module imports only modules listed before it.
CGROUPS = ("fs", "limits", "backends", "hierarchy", "kill", "tracking")


def modules() -> dict[str, Path]:
    return importgraph.modules(ROOT)


def graph() -> dict[str, set[str]]:
    return importgraph.graph(ROOT)


def package_of(name: str) -> str:
    """The package a module belongs to (a package's ``__init__`` belongs to the package)."""
    return importgraph.package_of(name)


def test_the_graph_sees_the_layout() -> None:
    edges = graph()
    assert f"{ROOT}.cgroups.tracking" in edges and f"{ROOT}.warm.zygote" in edges
    assert f"{ROOT}.cgroups.kill" in edges[f"{ROOT}.cgroups.tracking"]
    # an import under TYPE_CHECKING or in a function counts as well
    assert f"{ROOT}.zygote_program.child" in edges[f"{ROOT}.zygote_program.boot"]
    assert f"{ROOT}.proctree.spawn" in edges[f"{ROOT}.proctree.reaper"]


def test_no_import_cycle_between_modules() -> None:
    acyclic(graph())


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for name, targets in graph().items():
        here = package_of(name)
        packages.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    assert len(packages) >= 5  # workers itself, and its packages
    acyclic(packages)


def test_package_inits_import_nothing() -> None:
    """So that importing one module of a package (the reaper sidecar's, the program's shared
    constants) loads nothing else, and a package's parent is never a hidden edge of the graph."""
    for name, path in modules().items():
        if path.name == "__init__.py":
            tree = ast.parse(path.read_text())
            assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)], name


def layer(name: str) -> int:
    top = name.split(".")[2] if name != ROOT else ""
    return next((i for i, names in enumerate(LAYERS) if top in names), -1)


def test_imports_go_down_the_layers() -> None:
    assert all(layer(name) >= 0 for name in modules() if name != ROOT), "a module outside LAYERS"
    wrong = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if package_of(target) != package_of(name) and layer(target) >= layer(name)
    ]
    assert not wrong


def test_cgroups_import_in_one_direction() -> None:
    edges = graph()
    names = [f"{ROOT}.cgroups.{m}" for m in CGROUPS]
    assert set(names) == {n for n in edges if n.startswith(f"{ROOT}.cgroups.")}
    for i, name in enumerate(names):
        inside = {t for t in edges[name] if t.startswith(f"{ROOT}.cgroups.")}
        assert inside <= set(names[:i]), f"{name} imports {sorted(inside - set(names[:i]))}"
