"""Every registered algorithm under every CLI layer, at the CLI's defaults: each cell runs, or
is refused for an inadmissibility reason -- never because a default does not fit (an
encoding that overflows, a crash in the solve).

The cells keep every default that decides whether they fit (data set, 10 clients, so the
cohort the encodings are planned for, precision, bounds, the layer's parameters); only the
length of the run is cut: one round, and one local epoch where the algorithm trains.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import math
from pathlib import Path

import pytest

from secagg.algorithm_registry import load_algorithm
from secagg.cli import _make_parser, _run
from secagg.errors import EncodingOverflow, InadmissibleField, PrivacyError
from secagg.layers.registry import layer_names

ROOT = Path(__file__).resolve().parents[1]

#: Refusals that name an inadmissibility reason: a layer that cannot carry a field
#: (InadmissibleField), or a DP guarantee that cannot hold for the field (PrivacyError,
#: e.g. record-level DP on a model the client trained). Anything else fails the cell.
REFUSALS: tuple[type[Exception], ...] = (InadmissibleField, PrivacyError)


def _algorithms() -> list[str]:
    """The algorithms pyproject.toml registers (the ``secagg.algorithms`` entry points)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted(meta["project"]["entry-points"]["secagg.algorithms"])


def test_the_refusal_allow_list_does_not_cover_an_encoding_that_does_not_fit():
    assert not issubclass(EncodingOverflow, REFUSALS)
    assert len(_algorithms()) >= 8 and len(layer_names()) >= 6


@pytest.mark.parametrize("layer", layer_names())
@pytest.mark.parametrize("algorithm", _algorithms())
def test_default_cell_runs_or_is_refused_as_inadmissible(algorithm, layer, tmp_path):
    argv = ["run", "--algorithm", algorithm, "--layer", layer, "--rounds", "1", "--quiet",
            "--out", str(tmp_path / "out")]
    if "local_epochs" in inspect.signature(load_algorithm(algorithm)).parameters:
        argv += ["--local-epochs", "1"]
    if layer.endswith("-dp"):
        argv += ["--epsilon", "1"]  # a DP layer has no default budget: the CLI requires one
    args = _make_parser().parse_args(argv)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            rc = _run(args)
    except REFUSALS as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a reason"
        return
    assert rc == 0, f"{algorithm} under {layer}: no usable model"
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["algorithm"]["name"] == algorithm and result["rounds"] == 1
    assert math.isfinite(result["accuracy"]) and 0.0 <= result["accuracy"] <= 1.0
