"""No concrete layer type is dispatched on outside its own package (issue 34, point 4): a
module asks a layer what it declares on the Layer ABC (``is_dp``, ``wrapped``,
``aggregator_noises``, ``server_part``...) instead of testing which class it is.

Read with :mod:`ast` over secagg, algorithms and threat_models: ``isinstance`` /
``issubclass`` against a layer class, ``type(x) is / == / in`` a layer class, and a dict
keyed by layer classes. A layer class is any class deriving (transitively) from
``Layer``; its package is the folder of the module that defines it (``secagg/privacy`` for
the DP layers, ``secagg/layers`` for Plaintext and PerGroup).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secagg", "algorithms", "threat_models")

#: sites left, each with why: (file, enclosing function); none since the layer registry
#: (secagg.layers.registry) serves the engine, Flower and dp-audit
KNOWN: set[tuple[str, str]] = set()


def _files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def layer_classes() -> dict[str, str]:
    """Layer class name -> the package folder that defines it (relative to the root)."""
    bases: dict[str, tuple[set[str], str]] = {}
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases}
                bases.setdefault(node.name, (names, str(path.parent.relative_to(ROOT))))
    found = {"Layer"}
    grew = True
    while grew:
        new = {c for c, (b, _) in bases.items() if b & found} - found
        found |= new
        grew = bool(new)
    return {c: bases[c][1] for c in found if c != "Layer"}


def _named(node: ast.AST, classes: dict[str, str]) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in classes} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in classes}


def dispatch_sites(path: Path, classes: dict[str, str]) -> list[tuple[str, int, str]]:
    """(enclosing function, line, layer class) of each dispatch on a layer class in
    ``path`` outside the package that defines that class."""
    here = str(path.parent.relative_to(ROOT))
    tree = ast.parse(path.read_text())
    out: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else fn
            hits: set[str] = set()
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) \
                    and child.func.id in ("isinstance", "issubclass") and len(child.args) == 2:
                hits = _named(child.args[1], classes)
            elif isinstance(child, ast.Compare) and any(
                    isinstance(s, ast.Call) and isinstance(s.func, ast.Name)
                    and s.func.id == "type" for s in (child.left, *child.comparators)):
                hits = set().union(*(_named(s, classes) for s in (child.left,
                                                                   *child.comparators)))
            elif isinstance(child, ast.Dict):
                hits = set().union(set(), *(_named(k, classes) for k in child.keys
                                            if isinstance(k, ast.Name | ast.Attribute)))
            for cls in sorted(hits):
                if not here.startswith(classes[cls]):
                    out.append((name, child.lineno, cls))
            visit(child, name)

    visit(tree, "<module>")
    return out


def test_no_concrete_layer_type_is_dispatched_on_outside_its_package():
    classes = layer_classes()
    assert {"CentralDP", "LocalDP", "DistributedDP", "SecureSum", "Homomorphic",
            "Plaintext", "PerGroup"} <= set(classes)
    assert classes["CentralDP"] == "secagg/privacy"
    found = {}
    for path in _files():
        for fn, line, cls in dispatch_sites(path, classes):
            found.setdefault((str(path.relative_to(ROOT)), fn), []).append((line, cls))
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert new == {}, new
    assert set(found) == KNOWN  # a site fixed is taken off the list


def test_the_reader_finds_each_way_of_dispatching(tmp_path):
    """A synthetic module outside the privacy package: isinstance, type() comparisons and a
    dict keyed by type are each found; the same in the defining package is not."""
    classes = {"CentralDP": "secagg/privacy"}
    src = ("def a(x):\n    return isinstance(x, (int, CentralDP))\n"
           "def b(x):\n    return type(x) is CentralDP\n"
           "def c():\n    return {CentralDP: 1}\n"
           "def d(x):\n    return x.is_dp\n")
    (tmp_path / "secagg" / "sweep").mkdir(parents=True)
    (tmp_path / "secagg" / "privacy").mkdir(parents=True)
    out = tmp_path / "secagg" / "sweep" / "m.py"
    inside = tmp_path / "secagg" / "privacy" / "m.py"
    out.write_text(src)
    inside.write_text(src)
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [s[0] for s in dispatch_sites(out, classes)] == ["a", "b", "c"]
        assert dispatch_sites(inside, classes) == []
    finally:
        ROOT = saved


def test_what_the_dispatch_read_is_now_declared_by_the_layers():
    """The declared attributes give the answers the type checks gave: the sweep's observers
    without a guarantee, the engine's DP test, and the remote check (the layer registry's
    entries are exact classes: a subclass may change what the nodes rebuild, so it must be
    registered itself)."""
    import pytest

    from secagg import CentralDP, DistributedDP, LocalDP, Plaintext, SecureSum
    from secagg.engine import check_remote, is_dp, layer_server
    from secagg.errors import ConfigurationError
    from secagg.sweep.cells import _unprotected_observers

    central = CentralDP(Plaintext(), noise_multiplier=1.0)
    local = LocalDP(SecureSum(threshold=2), noise_multiplier=1.0)
    dist = DistributedDP(SecureSum(threshold=2), noise_multiplier=1.0)
    assert _unprotected_observers(central, True) == ("server",)
    assert _unprotected_observers(local, True) == _unprotected_observers(None, True) == ()
    assert _unprotected_observers(dist, False) == _unprotected_observers(local, False)
    assert [is_dp(x) for x in (central, local, dist, Plaintext())] == [True, True, True, False]
    assert central.wrapped is central.inner and Plaintext().wrapped is None
    for layer in (central, local, dist):
        check_remote(layer)
        dp, server = layer_server(layer)
        assert dp is layer and type(server).__name__ == {
            "plaintext": "PlaintextServer", "secure-sum": "SecureSumServer"}[layer.inner.name]

    class Sub(CentralDP):
        pass

    with pytest.raises(ConfigurationError, match="does not run on Flower"):
        check_remote(Sub(Plaintext(), noise_multiplier=1.0))
    with pytest.raises(ConfigurationError, match="DistributedDP around"):
        check_remote(DistributedDP(type("S", (SecureSum,), {})(threshold=2),
                                   noise_multiplier=1.0))
    with pytest.raises(ConfigurationError, match="LocalDP around CentralDP"):
        check_remote(LocalDP(central, noise_multiplier=1.0))
