"""The layout of ``elasticd.workers``: no import cycle between its modules or its packages, and
imports only downwards through its layers.

Imports are read from the source (``ast``), wherever they are: at the top, in a function, or under
``TYPE_CHECKING``; a cycle that only the type checker sees is a cycle for the reader too.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import elasticd.workers

ROOT = "elasticd.workers"
BASE = Path(elasticd.workers.__file__).parent

# Bottom to top. A module imports only from a lower layer, or from its own package.
LAYERS = (("zygote_program",), ("proctree", "cgroups"), ("group",), ("warm",))
# Within cgroups, bottom to top: each module imports only modules listed before it.
CGROUPS = ("fs", "limits", "backends", "hierarchy", "kill", "tracking")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(BASE.rglob("*.py")):
        parts = path.relative_to(BASE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((ROOT, *parts))] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``elasticd.workers`` that ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # "from a import b": b is a module when a file says so, else a name in a
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def package_of(name: str) -> str:
    """The package a module belongs to (a package's ``__init__`` belongs to the package)."""
    return name if (BASE / Path(*name.split(".")[2:]) / "__init__.py").exists() else name.rpartition(".")[0]


def acyclic(edges: dict[str, set[str]]) -> None:
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


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
