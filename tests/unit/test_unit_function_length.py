"""No function over 60 lines, decorators and docstring included: one that is longer does more than
one thing. ruff's complexity rules (pyproject.toml) bound its branches and statements; this bounds
what they do not count (a long table, a long literal, a long sequence of waits in a test)."""

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
