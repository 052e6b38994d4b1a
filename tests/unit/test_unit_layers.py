"""The layers of ``elasticd`` and ``elasticctl``: no import cycle between modules or packages, and
every import goes down the layer table of ``docs/architecture.md``.

A unit of the table is a package right under ``elasticd`` (``etcd``, ``jobs``, ...) or a module
there (``errors``, ``log``, ...); ``elasticctl`` is one unit. Imports are read from the source
(``tests.importgraph``), under ``TYPE_CHECKING`` and in functions too.
"""

from __future__ import annotations

import ast

from tests.importgraph import REPO, acyclic, collapse, graph, package_of

ROOTS = ("elasticd", "elasticctl")

# Bottom to top. A unit imports only units of a lower layer; units of one layer are independent.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("elasticd", "errors", "log", "aio", "netaddr"),  # the base: version, error codes, logging, helpers
    ("decode", "trustedpath"),  # typed decoding of untrusted input; root-safe paths
    ("terms",),  # the shared vocabulary: ids, the job spec and head, job states
    ("happenings",),  # typed records of what happened, and the bus that hands them out
    ("workers",),  # processes, cgroups, the warm parent
    (
        "etcd",
        "gpu",
        "progress",
        "portfilter",
    ),  # the store seam and key layout; GPUs through NVML; worker progress and hangs; the port filter
    # rounds, records and the reads of a job; the cluster event history; one local copy of key ranges
    ("rendezvous", "history", "informer"),
    ("node", "wire"),  # this node and its peers; the control protocol's messages
    ("jobs",),  # running one job's workers on this node, and the job rules above the store
    ("agent",),  # the per-job agent: record, step, executor
    ("manager",),  # the node's jobs, the command service, admission and janitor
    ("control", "metrics"),  # the control socket and its commands; metrics
    ("config",),  # the daemon's configuration
    ("daemon",),  # the composition root
    ("__main__", "worker", "elasticctl"),  # entry points and the clients
    ("integrations",),  # the frameworks' checkpoint hooks, over the training scripts' helper
)


def unit(name: str) -> str:
    """The layer table's unit of a module: ``elasticd.<unit>[...]`` or ``elasticctl``."""
    parts = name.split(".")
    if parts[0] == "elasticctl" or len(parts) == 1:
        return parts[0]
    return parts[1]


def innermost(name: str) -> str:
    package = package_of(name)
    return name if package in ROOTS else package


def layer(name: str) -> int:
    return next((i for i, units in enumerate(LAYERS) if unit(name) in units), -1)


def test_the_graph_sees_the_code() -> None:
    edges = graph(*ROOTS)
    assert "elasticd.agent.step" in edges and "elasticctl.cli" in edges
    assert "elasticd.terms.ids" in edges["elasticd.etcd.keys"]
    # an import in a function counts as well
    lazy = {t for n, ts in edges.items() for t in ts if n.startswith("elasticctl.")}
    assert "elasticd.wire" in lazy


def test_no_import_cycle_between_modules() -> None:
    acyclic(graph(*ROOTS))


def test_no_import_cycle_between_packages() -> None:
    """Every package, at every depth: a module belongs to the innermost package that holds it, but
    for the modules right under a root (``elasticd.errors``, ``elasticd.config``): the root is the
    whole program, not a package in it, and each of those modules is a unit of the table."""
    edges = graph(*ROOTS)
    packages = collapse(edges, {name: innermost(name) for name in edges})
    assert {"elasticd.jobs", "elasticd.workers.cgroups", "elasticd.control.commands"} <= set(packages)
    acyclic(packages)


def test_no_import_cycle_between_units() -> None:
    edges = graph(*ROOTS)
    units = collapse(edges, {name: unit(name) for name in edges})
    assert len(units) >= 20
    acyclic(units)


def test_every_unit_has_a_layer_and_the_table_names_only_units() -> None:
    edges = graph(*ROOTS)
    assert sorted({unit(n) for n in edges if layer(n) < 0}) == []
    named = [u for units in LAYERS for u in units]
    assert len(named) == len(set(named))
    assert set(named) == {unit(n) for n in edges}


def test_imports_go_down_the_layers() -> None:
    wrong = [
        f"{name} -> {target}"
        for name, targets in graph(*ROOTS).items()
        for target in targets
        if unit(target) != unit(name) and layer(target) >= layer(name)
    ]
    assert wrong == []


def test_the_docs_show_the_same_layers() -> None:
    """``docs/architecture.md`` holds this table, one row per layer, top first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| L")]
    documented = []
    for row in rows:
        cell = row.split("|")[2]
        documented.append(tuple(sorted(u.strip(" `/") for u in cell.split(",") if u.strip())))
    assert documented == [tuple(sorted(units)) for units in reversed(LAYERS)]


def test_the_bottom_imports_nothing_above_it() -> None:
    """``terms`` imports nothing of ``elasticd`` but the base and typed decoding."""
    below = {u for units in LAYERS[:2] for u in units}
    for name, targets in graph("elasticd").items():
        if unit(name) == "terms":
            assert {unit(t) for t in targets} - {"terms"} <= below, name
    init = ast.parse((REPO / "elasticd" / "terms" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_no_prefix_stands_in_for_a_package() -> None:
    """Modules that share a name's prefix (``zygote_boot``, ``zygote_child``) belong in a package
    of that name: in one folder, no two modules start with the same ``<prefix>_``."""
    for root in ROOTS:
        for folder in [REPO / root, *(p.parent for p in (REPO / root).rglob("*/__init__.py"))]:
            stems = [p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")]
            prefixes = [s.split("_")[0] for s in stems if "_" in s]
            shared = {p for p in prefixes if prefixes.count(p) > 1}
            assert not shared, f"{folder.relative_to(REPO)}: {sorted(shared)}_*.py"
