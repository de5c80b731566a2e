"""No import circles among secagg, algorithms and threat_models.

The graph is read from the source with :mod:`ast`: every ``import`` and ``from ... import``
of a module, at module level, inside a function (a lazy import still ties the two modules
together) or under ``if TYPE_CHECKING:`` (a type a module names is part of what it depends
on; a circle hidden there is still a circle of concepts). An import of a name from a package
goes to the submodule that defines it: a submodule of that name, else the package's lazy
``_EXPORTS`` table (secagg.lazy), else the package itself. Cycles are the strongly
connected components of that graph (Tarjan's algorithm), so any circle, however long, is
found.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secagg", "algorithms", "threat_models")


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions, classes, ``if TYPE_CHECKING:``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _lazy_exports(path: Path) -> dict[str, str]:
    """A package's ``_EXPORTS = {name: module}`` table, if it has one."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports."""
    mods = _modules(root, packages)
    exports = {name: _lazy_exports(p) for name, (p, is_pkg) in mods.items() if is_pkg}
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        here = name if is_pkg else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
                continue
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base not in mods:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                edges.add(sub if sub in mods else exports.get(base, {}).get(alias.name, base))
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_circles_among_the_three_packages():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 60 and "secagg.cli" in graph
    assert cycles(graph) == []


def test_the_graph_follows_lazy_and_function_level_imports():
    """The edges that made the three former circles are read (so a circle through them
    would be found): lazy exports, imports inside functions, relative imports."""
    graph = import_graph(ROOT, PACKAGES)
    cli_sweep = graph["secagg.cli.sweep"]  # `secagg sweep`'s module, inside its handler
    assert "secagg.sweep.cells" in cli_sweep or "secagg.sweep" in cli_sweep
    assert "secagg.seeds" in graph["secagg.privacy.dpsgd"]  # imported inside a function
    assert "threat_models.admissibility" in graph["threat_models.threat"]
    assert "secagg.layers.registry" in graph["secagg.sweep.cells"]


def test_a_circle_is_found_however_it_is_written(tmp_path):
    """A synthetic package: a three-module circle through a lazy export, a relative import
    and a function-level import, and a two-module circle through an import under
    TYPE_CHECKING (it counts)."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('_EXPORTS = {"B": "p.b"}\n')
    (pkg / "a.py").write_text("from p import B\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n    return g\n")
    (pkg / "c.py").write_text("import p.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from p.e import x\n")
    (pkg / "e.py").write_text("from p.d import y\n")
    graph = import_graph(tmp_path, ("p",))
    assert sorted(cycles(graph)) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]
    assert "p.e" in graph["p.d"]


def test_the_graph_sees_imports_under_type_checking():
    """The edge that hid the circle layers.plaintext -> link -> privacy.release ->
    layers.plaintext (issue 34) would be read: an import under TYPE_CHECKING is an edge."""
    graph = import_graph(ROOT, PACKAGES)
    for mod, (path, _) in _modules(ROOT, PACKAGES).items():
        tree = ast.parse(path.read_text())
        guarded = [n for n in ast.walk(tree) if isinstance(n, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(n.test)]
        for block in guarded:
            for imp in ast.walk(block):
                if isinstance(imp, ast.ImportFrom) and imp.module in graph and not imp.level:
                    assert imp.module in graph[mod] or any(
                        e.startswith(imp.module + ".") for e in graph[mod]), (mod, imp.module)
