"""One server-side secure-sum driver (issue 34): the secure-sum ``Server`` state machine is
constructed in exactly one module, the driver that runs over every link (Flower's, and the
in-process one behind ``run_secure_sum``).

Read from the source with :mod:`ast`: a call of the name ``Server`` imported from
``secagg.secure_sum.server`` (under any alias), or of the attribute ``Server`` of that module
imported under any name, counts as a construction.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secagg", "algorithms", "threat_models")
MODULE = "secagg.secure_sum.server"


def _constructions(path: Path) -> int:
    """How many calls in ``path`` construct secure_sum.server.Server."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()  # local names bound to the class
    modules: set[str] = set()  # local names bound to the module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == MODULE:
            names.update(a.asname or a.name for a in node.names if a.name == "Server")
        elif isinstance(node, ast.ImportFrom) and node.module == "secagg.secure_sum":
            modules.update(a.asname or a.name for a in node.names if a.name == "server")
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name == MODULE and a.asname)
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in names:
            count += 1
        elif isinstance(fn, ast.Attribute) and fn.attr == "Server" and (
                (isinstance(fn.value, ast.Name) and fn.value.id in modules)
                or ast.unparse(fn.value) == MODULE):
            count += 1
    return count


def _constructing_modules() -> dict[str, int]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            n = _constructions(path)
            if n:
                out[str(path.relative_to(ROOT))] = n
    return out


def test_the_reader_finds_a_construction_under_an_alias(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from secagg.secure_sum.server import Server as S\n"
                   "from secagg.secure_sum import server as srv\n"
                   "a = S(1)\nb = srv.Server(2)\nc = Server(3)\n")
    assert _constructions(src) == 2  # the bare ``Server`` here is another name


def test_the_secure_sum_server_is_constructed_in_one_module():
    found = _constructing_modules()
    assert list(found) == ["secagg/secure_sum/remote.py"], found
    assert found["secagg/secure_sum/remote.py"] == 1
