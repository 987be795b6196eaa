"""Imports run one way: no circle of any length among the project's own modules, and no import
of `harness` from `analysis` (analysis is pure functions over records; the verdict uses it, never
the reverse).

The graph is read from the source with `ast` (every `import` and `from ... import`, relative ones
and those inside functions included), so a circle closed by a lazy import inside a function is
seen too. A circle is a strongly connected component of more than one module; a check that only
looks at pairs of modules would miss one three modules long.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "decoders", "analysis", "suites")


def project_modules(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the given top-level packages."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _targets(node, module: str, is_package: bool, known) -> list[str]:
    """The project modules one import statement names (absolute, or resolved if relative)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [t for t in (_known_prefix(n, known) for n in names) if t]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    found = []
    for alias in node.names:  # `from pkg import sub` imports the submodule pkg.sub
        sub = f"{stem}.{alias.name}"
        target = sub if sub in known else _known_prefix(stem, known)
        if target:
            found.append(target)
    return found


def _known_prefix(name: str, known) -> str | None:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def import_graph(root: Path, packages) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its source."""
    modules = project_modules(root, packages)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(node, module, is_package, modules))
        edges.discard(module)
        graph[module] = edges
    return graph


def import_cycles(root: Path, packages) -> list[list[str]]:
    """Each strongly connected component of more than one module, as its sorted module names."""
    graph = import_graph(root, packages)
    names = sorted(graph)
    index = {name: i for i, name in enumerate(names)}
    edges = [(index[a], index[b]) for a, targets in graph.items() for b in targets]
    rows, cols = (np.array(x, dtype=int) for x in zip(*edges)) if edges else (np.array([], int),) * 2
    matrix = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(matrix, directed=True, connection="strong")
    groups = {}
    for name, label in zip(names, labels):
        groups.setdefault(label, []).append(name)
    return sorted(group for group in groups.values() if len(group) > 1)


def test_the_project_has_no_import_circle():
    graph = import_graph(ROOT, PACKAGES)
    # The walk saw the project: its own packages, sandbox included, with their edges.
    assert {"decoders.common", "decoders.kv", "decoders.lean", "suites.sandbox.parent"} <= set(graph)
    assert "decoders.context" in graph["decoders.kv"]
    cycles = import_cycles(ROOT, PACKAGES)
    assert cycles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_a_circle_three_modules_long_is_found(tmp_path):
    """The checker itself sees a deliberate circle closed by a relative import inside a function,
    and only that circle (a module that imports into it from outside is not part of it)."""
    pkg = tmp_path / "loop"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from loop import b\n")
    (pkg / "b.py").write_text("import loop.inner.c\n")
    (pkg / "inner" / "c.py").write_text("def late():\n    from .. import a\n    return a\n")
    (pkg / "outside.py").write_text("from .a import *\n")
    assert import_cycles(tmp_path, ("loop",)) == [["loop.a", "loop.b", "loop.inner.c"]]


def layering_violations(graph, lower: str, upper: str) -> list[str]:
    """Each `module -> target` edge from package `lower` into package `upper`."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[0] == lower
                  for t in targets if t.split(".")[0] == upper)


def test_analysis_never_imports_harness():
    graph = import_graph(ROOT, PACKAGES)
    assert "analysis.latency" in graph and "harness.calibration.floor" in graph
    assert layering_violations(graph, "analysis", "harness") == []


def test_an_analysis_import_of_harness_is_found(tmp_path):
    """The rule sees an import of harness from analysis, lazy (inside a function) or relative-free."""
    for package in ("analysis", "harness"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "harness" / "gate.py").write_text("from analysis import stats\n")
    (tmp_path / "analysis" / "stats.py").write_text("def late():\n    from harness import gate\n")
    graph = import_graph(tmp_path, ("analysis", "harness"))
    assert layering_violations(graph, "analysis", "harness") == ["analysis.stats -> harness.gate"]
