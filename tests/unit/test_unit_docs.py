"""The docs point at what exists: every file named in them is in the repository, every page the
README links to is there, and the table of ``workers/`` in the code layout is the layout
``tests/unit/test_unit_workers_layout.py`` holds the code to."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit import test_unit_workers_layout as workers

REPO = Path(__file__).resolve().parents[2]
# The README, the user guide and the design (every page under docs/, which mkdocs.yml builds), and
# the pages beside the code.
DOCS = (
    "README.md",
    "bench/README.md",
    "SECURITY.md",
    *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")),
)
# Files the docs name that are a user's, not ours: a module shadowing a library (in an example), and
# a host's settings (made from packaging/elasticd.toml.example).
NOT_OURS = {"numpy.py", "elasticd.toml"}
NAMED = re.compile(r"`([\w.-]+(?:/[\w.-]+)*\.(?:py|md|toml|sh|service|ya?ml|json|txt|cfg))`")
SKIP = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def test_every_file_the_docs_name_exists() -> None:
    files = {p.relative_to(REPO).as_posix() for p in REPO.rglob("*") if not SKIP & set(p.parts)}
    names = {f.rpartition("/")[2] for f in files}
    missing = []
    for doc in DOCS:
        for named in sorted(set(NAMED.findall((REPO / doc).read_text())) - NOT_OURS):
            if "/" in named:  # a path: relative to the repository or to a package in it
                found = any(f == named or f.endswith("/" + named) for f in files)
            else:
                found = named in names
            if not found:
                missing.append(f"{doc}: {named}")
    assert missing == []


def test_every_link_of_the_readme_leads_to_a_file() -> None:
    """The README is read on its own (on a forge, in the package): its relative links are paths in
    the repository, which mkdocs' strict build does not see."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (REPO / "README.md").read_text())
    assert [link for link in links if "://" not in link and not (REPO / link).exists()] == []


def test_the_workers_table_shows_the_workers_layout() -> None:
    """One row per package or module of ``workers/``, numbered by its layer (1: the bottom)."""
    text = (REPO / "docs" / "architecture" / "code-layout.md").read_text()
    section = text.split("## workers/: packages in layers", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip().isdigit():
            rows[cells[2].strip(" `").removeprefix("workers/").removesuffix("/").removesuffix(".py")] = int(
                cells[1]
            )
    layout = {name: i + 1 for i, names in enumerate(workers.LAYERS) for name in names}
    assert rows == layout
    on_disk = {p.stem for p in workers.BASE.glob("*.py") if p.stem != "__init__"}
    on_disk |= {p.parent.name for p in workers.BASE.glob("*/__init__.py")}
    assert set(rows) == on_disk
