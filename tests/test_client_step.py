"""One client step (issue 34, point 3): :func:`secagg.client_step.run_step` does the phase's
step, its timing (with the phase's ``client_cpu_s`` hook), the upload check against the spec
and the clip count, and it is the one place a runtime calls a phase's ``client_step``.

The AST check reads secagg, algorithms and threat_models: a call ``<x>.client_step(...)``
may appear only in ``secagg/client_step.py``, or inside a method itself named
``client_step`` (a phase wrapper delegating to the phase it wraps, e.g. the sweep cache's
taped phase), or at a site listed in KNOWN with why.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from secagg.client_step import reply_fields, run_step
from secagg.data.containers import ClientData
from secagg.engine import ClientState
from secagg.errors import ConfigurationError, UploadError
from secagg.messages import Bound, ClipReport, Field, Upload, UploadSpec
from secagg.phase import PhaseBase

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secagg", "algorithms", "threat_models")
HOME = "secagg/client_step.py"

#: sites outside the one module, each with why: (file, enclosing function)
KNOWN = {
    # the additivity audit evaluates a phase's raw statistic on sub-sampled data in
    # plaintext (no upload leaves, nothing is validated or booked): an analysis, not a step
    ("threat_models/additivity.py", "_run"),
    ("threat_models/additivity.py", "_advance"),
}


def _step_calls() -> set[tuple[str, str]]:
    """(file, enclosing function) of every ``<x>.client_step(...)`` call, except a phase
    wrapper's own ``client_step`` delegating to its inner phase."""
    found: set[tuple[str, str]] = set()
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text())

            def visit(node: ast.AST, func: str, rel: str = rel) -> None:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    func = node.name
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "client_step" and func != "client_step"):
                    found.add((rel, func))
                for child in ast.iter_child_nodes(node):
                    visit(child, func)

            visit(tree, "<module>")
    return found


def test_a_phase_step_is_called_in_one_module() -> None:
    calls = _step_calls()
    homes = {f for f, _ in calls - KNOWN}
    assert homes == {HOME}, f"client_step called outside {HOME}: {sorted(calls - KNOWN)}"
    assert KNOWN <= calls, f"stale KNOWN entries: {sorted(KNOWN - calls)}"


def test_the_runtimes_call_the_one_step() -> None:
    for rel in ("secagg/engine.py", "secagg/flower/client.py"):
        names = {n.func.id for n in ast.walk(ast.parse((ROOT / rel).read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "run_step" in names, rel
    text = (ROOT / "secagg/local_link.py").read_text()
    assert "reply_fields(" in text  # the reply's step fields, as the Flower node sends


# ---------------------------------------------------------------- the step itself

SPEC = UploadSpec((Field("s", (3,), "float64", Bound(l2=1.0), additive=True),
                   Field("n", (1,), "int64", additive=True)), max_records=10)


class _Phase(PhaseBase):
    """A phase that counts its steps; its values and CPU hook are set by each test."""

    name = "p"

    def __init__(self, values: Mapping[str, Any], hook: bool = False) -> None:
        self.values, self.steps, self.hooked = dict(values), 0, hook

    def spec(self) -> UploadSpec:
        return SPEC

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]
                    ) -> dict[str, Any]:
        self.steps += 1
        return {k: np.asarray(v) * float(broadcast.get("scale", 1.0)) if k == "s"
                else np.asarray(v) for k, v in self.values.items()}

    def server_step(self, aggregate: Any) -> None:
        return None

    def client_flops(self, client: ClientState) -> float:
        return 7.0 * client.n_records

    def client_cpu_s(self, client: ClientState, measured: float) -> float:
        return measured + 100.0 + client.id if self.hooked else measured


def _client(cid: int = 3, n: int = 4) -> ClientState:
    rng = np.random.default_rng(0)
    return ClientState(ClientData(cid, rng.normal(size=(n, 2)), np.zeros(n, dtype=np.int64)))


def test_step_times_books_flops_and_validates() -> None:
    ph = _Phase({"s": [0.1, 0.2, 0.3], "n": [4]})
    up = run_step(ph, _client(), {}, SPEC)
    assert isinstance(up, Upload) and ph.steps == 1
    assert up.client == 3 and up.flops == 28.0 and up.cpu_s >= 0.0
    np.testing.assert_array_equal(up["s"], [0.1, 0.2, 0.3])
    assert up["n"].dtype == np.int64


def test_the_phase_cpu_hook_books_the_step() -> None:
    up = run_step(_Phase({"s": [0.0] * 3, "n": [1]}, hook=True), _client(cid=5), {}, SPEC)
    assert 105.0 <= up.cpu_s < 106.0


def test_a_clip_is_counted_once_and_reported() -> None:
    clips = ClipReport()
    ph = _Phase({"s": [3.0, 4.0, 0.0], "n": [4]})  # L2 5 > 4 records * 1.0
    up = run_step(ph, _client(), {}, SPEC, on_violation="clip", clips=clips)
    assert clips.counts == {"s": 1}
    assert np.linalg.norm(up["s"]) == pytest.approx(4.0)
    rep = reply_fields(up)
    assert json.loads(rep["clipped"]) == {"s": 1} and rep["flops"] == 28.0
    with pytest.raises(UploadError, match="client 3"):
        run_step(ph, _client(), {}, SPEC)  # the default refuses it
    assert clips.counts == {"s": 1}


@pytest.mark.parametrize("bad", [{"s": [np.nan, 0, 0], "n": [1]}, {"s": [0, 0], "n": [1]},
                                 {"s": [0, 0, 0]}, {"s": [0, 0, 0], "n": [1], "x": [1]},
                                 {"s": [0.0] * 3, "n": [0.5]}])
def test_a_malformed_upload_is_a_typed_error(bad: dict[str, Any]) -> None:
    clips = ClipReport()
    with pytest.raises(UploadError):
        run_step(_Phase(bad), _client(), {}, SPEC, clips=clips, on_violation="clip")
    assert clips.counts == {}


def test_a_client_over_max_records_is_refused() -> None:
    with pytest.raises(UploadError, match="max_records=10"):
        run_step(_Phase({"s": [0.0] * 3, "n": [1]}), _client(n=11), {}, SPEC)


def test_a_halted_client_runs_no_step_and_sends_zeros() -> None:
    ph = _Phase({"s": [0.5, 0.0, 0.0], "n": [4]}, hook=True)
    screened: list[int] = []
    up = run_step(ph, _client(), {}, SPEC, halted=True,
                  screen=lambda spec, u: screened.append(u.client) or u)
    assert ph.steps == 0 and screened == []  # neither the step nor the filter
    assert not up["s"].any() and not up["n"].any()
    assert up.cpu_s < 100.0  # no hook for work never done


def test_the_screen_replaces_what_leaves() -> None:
    clips = ClipReport()

    def silence(spec: UploadSpec, up: Upload) -> Upload:
        return Upload.validate(spec, {f.name: np.zeros(f.shape, f.dtype)
                                      for f in spec.fields}, up.client, up.n_records)

    ph = _Phase({"s": [3.0, 4.0, 0.0], "n": [4]})
    up = run_step(ph, _client(), {}, SPEC, on_violation="clip", screen=silence, clips=clips)
    assert not up["s"].any() and clips.counts == {} and up.flops == 28.0


def test_a_spec_given_after_the_step_is_the_one_checked() -> None:
    seen: list[int] = []

    def after() -> UploadSpec:
        seen.append(ph.steps)
        return SPEC

    ph = _Phase({"s": [0.1, 0.0, 0.0], "n": [1]})
    up = run_step(ph, _client(), {"scale": np.array(2.0)}, after)
    assert seen == [1] and up.spec is SPEC and up["s"][0] == pytest.approx(0.2)

    def refuse() -> UploadSpec:
        raise ConfigurationError("spec changed")

    with pytest.raises(ConfigurationError, match="spec changed"):
        run_step(ph, _client(), {}, refuse)


def test_a_local_phase_must_return_nothing() -> None:
    empty = UploadSpec(())
    up = run_step(_Phase({}), _client(), {}, empty)
    assert dict(up) == {} and up.flops == 28.0
    with pytest.raises(ConfigurationError, match="a local phase must return"):
        run_step(_Phase({"s": [1.0]}), _client(), {}, empty)
