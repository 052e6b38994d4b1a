"""Imports read from the source (``ast``), wherever they are: at the top, in a function, or under
``TYPE_CHECKING``; a cycle that only the type checker sees is a cycle for the reader too.

The layout tests (``test_unit_layers``, ``test_unit_workers_layout``) build their module and
package graphs from here.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def modules(root: str) -> dict[str, Path]:
    """Every module under the package ``root`` (dotted), by dotted name; a package by its name."""
    base = REPO.joinpath(*root.split("."))
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((root, *parts))] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports, anywhere in its source."""
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


def graph(*roots: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, over the packages ``roots`` (imports between them count)."""
    known = {name: path for root in roots for name, path in modules(root).items()}
    return {name: imported(name, path, known) for name, path in known.items()}


def is_package(name: str) -> bool:
    return REPO.joinpath(*name.split("."), "__init__.py").exists()


def package_of(name: str) -> str:
    """The package a module belongs to (a package's ``__init__`` belongs to the package)."""
    return name if is_package(name) else name.rpartition(".")[0]


def collapse(edges: dict[str, set[str]], group: dict[str, str]) -> dict[str, set[str]]:
    """The graph between groups (``group``: module -> its group), without the edges inside one."""
    out: dict[str, set[str]] = {}
    for name, targets in edges.items():
        here = group[name]
        out.setdefault(here, set()).update(group[t] for t in targets if group[t] != here)
    return out


def acyclic(edges: dict[str, set[str]]) -> None:
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None
