"""No function over 60 lines, decorators and docstring included: one that is longer does more than
one thing. ruff's complexity rules (pyproject.toml) bound its branches and statements; this bounds
what they do not count (a long table, a long literal, a long sequence of waits in a test). And no
module of the daemon, the CLIs or the benches much over 400 lines: one that is longer holds more
than one concern."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("elasticd", "elasticctl", "bench", "tests", "examples")
MAX_LINES = 60


def _too_long(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > MAX_LINES:
                out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_over_60_lines() -> None:
    files = [p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))]
    assert len(files) > 100  # the roots are where this test thinks they are
    long = [f for p in files for f in _too_long(p)]
    assert not long, "split these into well-named helpers:\n" + "\n".join(long)


# A module of one concern reads in one sitting: about 400 lines, with a margin so that a module near
# the bound is not split mid-concern for a few lines (the daemon's, the CLIs' and the benches' modules;
# tests are suites, bounded by their functions).
MODULE_ROOTS = ("elasticd", "elasticctl", "bench")
MAX_MODULE_LINES = 450


def test_no_module_over_450_lines() -> None:
    files = [p for root in MODULE_ROOTS for p in sorted((REPO / root).rglob("*.py"))]
    assert any(p.parent.name == "bench" for p in files)  # the benches are where this test thinks they are
    long = [
        f"{p.relative_to(REPO)} ({n} lines)"
        for p in files
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "split these along their concerns:\n" + "\n".join(long)
