"""One stage vocabulary (issue 34, point 4): stage names and message keys live in
:mod:`secagg.stages` only.

What counts as a *stage use* (checked by :func:`stage_literals`): in any module of
``secagg/`` other than ``secagg/stages.py``, a string literal (``ast.Constant``) whose
value is one of :data:`CHECKED_STAGES`, or a literal or f-string that starts with
``dropped:`` -- wherever it stands: a comparison operand, a dict key or value, a subscript,
a call argument, a default, an assignment, a tuple element. Not a use: a docstring (the
first statement of a module, class or function), the prose around a name inside a longer
literal or f-string (an error message mentioning "the unmask stage" is not a literal equal
to ``"unmask"``), and the attribute name given to ``hasattr``/``getattr``.

Stage names that are ordinary words used elsewhere as JSON keys or operation names
(``keys``, ``decrypt``, ``result``, ``proof``, ``check``) are in the vocabulary but not in
:data:`CHECKED_STAGES`: a literal-anywhere rule cannot tell those uses apart.

What counts as a *key use* (:func:`key_literals`), in the modules that build or read
instructions and replies (:data:`WIRE_MODULES`): a literal equal to a :class:`Key` value
as a subscript, a dict-literal key, the first argument of ``.get``/``.pop``, the name
argument of ``reply_field`` (also imported as ``field``/``rfield``), the name in a reply's
``(name, type)`` needs pair, or the left operand of ``in``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from secagg import stages
from secagg.stages import SECURE_SUM_STAGES, STEPS, Key, Stage

ROOT = Path(__file__).resolve().parents[1] / "secagg"

#: the stage names no module may spell as a literal
CHECKED_STAGES = frozenset({
    Stage.HELLO, Stage.CLOSE, Stage.EVALUATE, Stage.BROADCAST, Stage.LOCAL, Stage.UPLOAD,
    Stage.ADVERTISE, Stage.SHARE, Stage.MASKED_INPUT, Stage.CONSISTENCY, Stage.UNMASK,
    Stage.ADVERTISE_NEXT, Stage.HE_KEYGEN, Stage.HE_UPLOAD, Stage.HE_DECRYPT,
})

#: No file is exempt (the secure-sum state machine's files joined once their branch landed).
PENDING_FILES: frozenset[str] = frozenset()

#: Justified exceptions: the same word with another meaning (path, value, why).
SAME_WORD = {
    ("privacy/local.py", "local"): "LocalDP's noise_scaling kind (noise added locally)",
    ("layers/registry.py", "local"): "the dp-audit kind of LocalDP (audit='local')",
}

#: the modules that build or read instructions and replies
WIRE_MODULES = (
    "link.py", "node.py", "local_link.py", "layers/plaintext.py", "secure_sum/remote.py",
    "secure_sum/node.py", "homomorphic/remote.py", "homomorphic/node.py",
    "flower/client.py", "flower/node_identity.py", "flower/node_privacy.py",
    "flower/server.py", "flower/records.py",
)
KEYS = frozenset(v for k, v in vars(Key).items() if k.isupper())
_FIELD_READERS = {"reply_field", "field", "rfield"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of ``tree``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _attribute_names(tree: ast.AST) -> set[int]:
    """The ids of the literal attribute names given to hasattr/getattr/setattr."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in {"hasattr", "getattr", "setattr"} and len(node.args) > 1):
            out.add(id(node.args[1]))
    return out


def stage_literals(source: str, names: frozenset[str] = CHECKED_STAGES) -> list[tuple[int, str]]:
    """(line, value) of each stage use in ``source`` (see the module docstring)."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _attribute_names(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and first.value.startswith(Stage.DROPPED_PREFIX)):
                hits.append((node.lineno, first.value))
            skip.update(id(v) for v in node.values)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in skip
              and (node.value in names or node.value.startswith(Stage.DROPPED_PREFIX))):
            hits.append((node.lineno, node.value))
    return sorted(hits)


def key_literals(source: str) -> list[tuple[int, str]]:
    """(line, value) of each key use in ``source`` (see the module docstring)."""
    tree = ast.parse(source)
    spots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            spots.append(node.slice)
        elif isinstance(node, ast.Dict):
            spots.extend(k for k in node.keys if k is not None)
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr in {"get", "pop"} and node.args:
                spots.append(node.args[0])
            if (isinstance(fn, ast.Name) and fn.id in _FIELD_READERS
                    and len(node.args) > 1):
                spots.append(node.args[1])
        elif (isinstance(node, ast.Tuple) and len(node.elts) == 2
              and isinstance(node.elts[1], ast.Name)
              and node.elts[1].id in {"bytes", "float", "str", "int", "bool"}):
            spots.append(node.elts[0])
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            spots.append(node.left)
    return sorted((s.lineno, s.value) for s in spots
                  if isinstance(s, ast.Constant) and s.value in KEYS)


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.name != "stages.py"
                  or p.parent != ROOT)


def test_no_stage_name_is_a_literal_outside_the_vocabulary() -> None:
    found = {}
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel in PENDING_FILES:
            continue
        hits = [(line, v) for line, v in stage_literals(path.read_text())
                if (rel, v) not in SAME_WORD]
        if hits:
            found[rel] = hits
    assert found == {}, f"stage names spelled as literals (use secagg.stages): {found}"


@pytest.mark.parametrize("module", WIRE_MODULES)
def test_no_message_key_is_a_literal_in_the_drivers_and_nodes(module: str) -> None:
    hits = key_literals((ROOT / module).read_text())
    assert hits == [], f"{module}: message keys spelled as literals (use secagg.stages.Key)"


def test_the_checkers_see_what_they_claim_to() -> None:
    """Each kind of use is flagged; docstrings, prose and attribute names are not."""
    src = '''"""advertise"""
def f(stage, rec, ctx):
    """unmask"""
    if stage == "share":
        pass
    ctx.message(1, 2, "masked-input", 0)
    ctx.message(1, 2, f"dropped:{stage}", 0)
    x = {"upload": 1}[ "hello" ]
    hasattr(ctx, "close")
    raise ValueError(f"the unmask stage of {stage}")
    return rec["msg"], rec.get("cpu_s"), field(rec, "flops", float), ("clipped", str), \\
        "with_step" in rec, {"step": 1}
'''
    assert sorted(v for _, v in stage_literals(src)) == sorted(
        ["share", "masked-input", "dropped:", "upload", "hello"])
    assert sorted(v for _, v in key_literals(src)) == sorted(
        ["msg", "cpu_s", "flops", "clipped", "with_step", "step"])


def test_the_vocabulary_keeps_the_wire_spelling() -> None:
    """The constants are plain str with today's wire and ledger values."""
    assert SECURE_SUM_STAGES == ("advertise", "share", "masked-input", "consistency", "unmask")
    assert STEPS == ("hello", "upload", "advertise", "share", "masked-input", "consistency",
                     "unmask", "advertise-next", "he-keygen", "he-upload", "he-decrypt",
                     "evaluate", "close")
    assert stages.dropped_stage(Stage.UNMASK) == "dropped:unmask"
    for cls in (Stage, Key):
        values = [v for k, v in vars(cls).items() if k.isupper()]
        assert all(type(v) is str for v in values)
        if cls is Key:
            assert len(set(values)) == len(values)
